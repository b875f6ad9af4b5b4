//! Likely label errors: the images whose given label a trained model finds least likely, by
//! confident learning (Northcutt, Jiang and Chuang, "Confident Learning: Estimating Uncertainty
//! in Dataset Labels", JAIR 2021, section 3.1 "the confident joint").
//!
//! For each class `j` the threshold `t_j` is the model's average probability of `j` over the
//! images labelled `j` (its own confidence on that class). An image labelled `i` is *confidently*
//! of class `j` when `p_j >= t_j`; of several such classes, the most probable. An image
//! confidently of a class other than its label, and whose most probable class is not its label
//! either (cleanlab's `filter_by="both"`: on a small class the threshold is low, and alone it
//! flags images the model still gives their label), is an issue. Issues are ranked by the
//! probability of the given label, lowest first ("self-confidence", the paper's and cleanlab's
//! default ranking).
//!
//! The paper scores out-of-sample probabilities (cross-validation). vramfit ranks with the
//! trained model: on validation images that is out of sample; on training images the model has
//! seen the label, which hides some errors it memorised. `vramfit bench label-errors` measures
//! the recall of both (docs/data-health.md).

use std::fmt::Write as _;

/// The ranking's file in a run folder (`vramfit eval` writes `label_issues.csv` in the working
/// directory, or where `--label-issues` says).
pub const REPORT_FILE: &str = "label_issues.csv";

/// The header of [`to_csv`]'s file.
pub const HEADER: &str = "path,split,given_label,predicted_label,given_probability,predicted_probability";

/// One image whose label the model doubts.
#[derive(Clone, Debug, PartialEq)]
pub struct LabelIssue {
    /// The image's index in the list scored.
    pub index: usize,
    /// Its given label.
    pub given: usize,
    /// The class it confidently belongs to.
    pub predicted: usize,
    /// The model's probability of the given label, 0..1.
    pub given_probability: f32,
    /// The model's probability of the predicted class, 0..1.
    pub predicted_probability: f32,
}

/// The label issues among `labels.len()` images with softmax probabilities `probs`
/// (`[n * classes]`, row-major), most doubtful first (module docs). A class with no image
/// labelled with it has no threshold and is never predicted.
///
/// # Panics
/// When `probs.len() != labels.len() * classes` or a label is not below `classes`.
pub fn rank(probs: &[f32], labels: &[usize], classes: usize) -> Vec<LabelIssue> {
    assert_eq!(probs.len(), labels.len() * classes, "probabilities are [images * classes]");
    let thresholds = class_thresholds(probs, labels, classes);
    let mut issues: Vec<LabelIssue> = labels
        .iter()
        .enumerate()
        .filter_map(|(index, &given)| {
            let row = &probs[index * classes..(index + 1) * classes];
            let predicted = (0..classes)
                .filter(|&j| thresholds[j].is_some_and(|t| row[j] >= t))
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))?;
            // And the model's most probable class is not the given one (cleanlab's
            // `filter_by="both"`): a small class's low threshold alone does not flag an image
            // the model still gives its label.
            let top = (0..classes).max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))?;
            (predicted != given && top != given).then(|| LabelIssue {
                index,
                given,
                predicted,
                given_probability: row[given],
                predicted_probability: row[predicted],
            })
        })
        .collect();
    issues.sort_by(|a, b| a.given_probability.total_cmp(&b.given_probability).then(a.index.cmp(&b.index)));
    issues
}

/// `t_j`: the mean probability of class `j` over the images labelled `j`; `None` without any.
fn class_thresholds(probs: &[f32], labels: &[usize], classes: usize) -> Vec<Option<f32>> {
    let mut sums = vec![0f64; classes];
    let mut counts = vec![0usize; classes];
    for (i, &label) in labels.iter().enumerate() {
        sums[label] += f64::from(probs[i * classes + label]);
        counts[label] += 1;
    }
    sums.iter().zip(&counts).map(|(&s, &n)| (n > 0).then(|| (s / n as f64) as f32)).collect()
}

/// The issues as CSV: `path,split,given_label,predicted_label,given_probability,predicted_probability`,
/// one row per issue in rank order; `names[index]` is each image's path and `splits[index]` its
/// split (`train`/`val`). Fields are quoted where they hold a comma, quote or line break.
pub fn to_csv(issues: &[LabelIssue], names: &[String], splits: &[&str], class_names: &[String]) -> String {
    let mut out = format!("{HEADER}\n");
    for issue in issues {
        let _ = writeln!(
            out,
            "{},{},{},{},{:.6},{:.6}",
            csv_field(&names[issue.index]),
            splits[issue.index],
            csv_field(&class_names[issue.given]),
            csv_field(&class_names[issue.predicted]),
            issue.given_probability,
            issue.predicted_probability
        );
    }
    out
}

/// A CSV field, quoted (RFC 4180) when it holds a comma, a quote or a line break.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_confident_off_label_images_lowest_given_probability_first() {
        // Three classes. Images 0-2 labelled 0, 3-5 labelled 1, 6 labelled 2.
        let probs = [
            [0.9, 0.05, 0.05],
            [0.8, 0.1, 0.1],
            [0.1, 0.85, 0.05], // labelled 0, confidently 1
            [0.1, 0.8, 0.1],
            [0.05, 0.9, 0.05],
            [0.3, 0.55, 0.15], // labelled 1, unsure: under t_0 = 0.6, t_1 = 0.75 and t_2 = 0.2
            [0.7, 0.1, 0.2],   // labelled 2 (t_2 = 0.2): confidently 0 (0.7 >= 0.6) and 2; 0 is more probable
        ];
        let flat: Vec<f32> = probs.iter().flatten().copied().collect();
        let issues = rank(&flat, &[0, 0, 0, 1, 1, 1, 2], 3);
        assert_eq!(issues.iter().map(|i| (i.index, i.predicted)).collect::<Vec<_>>(), vec![(2, 1), (6, 0)]);
        assert_eq!(issues[0].given_probability, 0.1);
        assert_eq!(issues[1].predicted_probability, 0.7);
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        let issue =
            LabelIssue { index: 0, given: 0, predicted: 1, given_probability: 0.25, predicted_probability: 0.5 };
        let csv = to_csv(&[issue], &["a,b/x \"1\".png".into()], &["val"], &["cat".into(), "dog".into()]);
        assert_eq!(
            csv,
            "path,split,given_label,predicted_label,given_probability,predicted_probability\n\
             \"a,b/x \"\"1\"\".png\",val,cat,dog,0.250000,0.500000\n"
        );
    }
}
