//! Class imbalance: the ratio of the largest class to the smallest, and when it is worth a
//! warning.

use serde::Serialize;

/// Largest/smallest class above which `check-data` and `train` warn. At 3:1 a model
/// trained for plain accuracy already gives up recall on the small class where classes look
/// alike (C34, 20:1: the 3 `rare` images were all classified `common`); below it, imbalance
/// rarely matters next to the data's other faults.
pub const WARN_RATIO: f64 = 3.0;

/// A dataset's class sizes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Imbalance {
    /// Images per class, label order.
    pub counts: Vec<usize>,
    /// Class names, label order.
    pub class_names: Vec<String>,
}

impl Imbalance {
    /// Largest class size over smallest (the smallest counted as at least 1; 1.0 without classes).
    pub fn ratio(&self) -> f64 {
        let max = self.counts.iter().max().copied().unwrap_or(0);
        let min = self.counts.iter().min().copied().unwrap_or(0);
        if max == 0 { 1.0 } else { max as f64 / min.max(1) as f64 }
    }

    /// The warning when the ratio is above [`WARN_RATIO`]: the largest and smallest classes and
    /// what to do.
    pub fn warning(&self) -> Option<String> {
        let ratio = self.ratio();
        if ratio <= WARN_RATIO {
            return None;
        }
        let largest = (0..self.counts.len()).max_by_key(|&c| (self.counts[c], std::cmp::Reverse(c)))?;
        let smallest = (0..self.counts.len()).min_by_key(|&c| (self.counts[c], c))?;
        Some(format!(
            "class imbalance {ratio:.1}:1 (largest `{}` {} images, smallest `{}` {}): a model trained for accuracy \
             learns to neglect small classes; add images to the small classes, or set train.class_weights = \
             \"balanced\" (the loss weighs each class equally) or data.sampler = \"balanced\" (each batch draws \
             classes evenly), and judge the model by balanced accuracy (eval prints it)",
            self.class_names[largest], self.counts[largest], self.class_names[smallest], self.counts[smallest]
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(counts: &[usize]) -> Imbalance {
        Imbalance { counts: counts.to_vec(), class_names: (0..counts.len()).map(|c| format!("c{c}")).collect() }
    }

    #[test]
    fn warns_above_the_ratio_naming_both_classes() {
        assert_eq!(of(&[60, 3]).ratio(), 20.0);
        let w = of(&[60, 3]).warning().unwrap();
        assert!(w.starts_with("class imbalance 20.0:1 (largest `c0` 60 images, smallest `c1` 3)"), "{w}");
        assert!(of(&[30, 10]).warning().is_none(), "3:1 is the limit");
        assert!(of(&[31, 10, 12]).warning().is_some());
        assert_eq!(of(&[5, 0]).ratio(), 5.0);
        assert_eq!(of(&[]).ratio(), 1.0);
    }
}
