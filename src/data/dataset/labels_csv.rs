//! A dataset given as a CSV file of image paths and labels, as Kaggle and most labelling tools
//! export them: `path,label` with an optional `split` column.
//!
//! Rules:
//! - Fields as RFC 4180 writes them: a field holding a comma or a quote is quoted, a quote inside
//!   doubled (`""`); a field may not span lines. A UTF-8 byte-order mark and blank lines are
//!   skipped; `\r\n` line ends are read like `\n`.
//! - The first row is a header when one of its cells is a column name ([`PATH_NAMES`],
//!   [`LABEL_NAMES`], `split`, any case): columns are then found by name, in any order, and
//!   others are ignored. Without a header the columns are `path,label[,split]`.
//! - A path is relative to the CSV file's folder (`/` or `\` separated) or absolute. One that
//!   leaves the folder (`..`, an absolute path elsewhere) is refused, naming the line, unless
//!   `data.csv_paths_outside = true`: a CSV from the internet could otherwise point training,
//!   and the reports that name files, anywhere on the disk.
//! - `split` is `train`, `val` (`valid`, `validation`) or `test` (validation too); an empty cell
//!   or no split column puts the row under the held-out rule folders follow
//!   (`data.val_fraction`, stratified and seeded).
//! - Classes are the labels, byte-exact, in code-point order (as folder names are).
//! - Every row that cannot be used is an error naming the file and line: a missing image file,
//!   an empty label, a malformed row, an unknown split. All of them are listed (up to 10, then
//!   counted), so one pass fixes the file.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use super::{Dataset, Sample, SampleSource, ScanReport, Splits, held_out_note, split};
use crate::engine::error::{Error, Result};

/// Header names of the path column.
pub const PATH_NAMES: [&str; 7] = ["path", "file", "filename", "file_name", "image", "image_path", "filepath"];

/// Header names of the label column.
pub const LABEL_NAMES: [&str; 5] = ["label", "class", "category", "target", "class_name"];

/// Problems listed in one error before the rest are counted.
const LISTED: usize = 10;

/// Whether `path` names a labels CSV file (by its extension, any case).
pub fn is_labels_csv(path: &Path) -> bool {
    path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"))
}

/// Which column holds what.
#[derive(Debug)]
struct Columns {
    path: usize,
    label: usize,
    split: Option<usize>,
}

/// One usable row.
struct Row {
    file: PathBuf,
    label: String,
    split: Option<crate::data::split_record::Split>,
}

/// Opens the labels CSV `csv` and splits it (module docs); `outside` allows paths that leave
/// the file's folder.
///
/// # Errors
/// [`Error::Dataset`] naming the file: unreadable, not UTF-8, no rows, or each row that cannot be
/// used with its line number and the fix.
pub fn open(csv: &Path, opts: &super::ScanOptions) -> Result<Splits> {
    let err = |message: String| Error::Dataset { path: csv.into(), message };
    let text = std::fs::read(csv).map_err(|e| err(format!("cannot read the labels file: {e}")))?;
    let text = String::from_utf8(text).map_err(|e| {
        err(format!(
            "is not UTF-8 (byte {}); save it as UTF-8 (CSV UTF-8 in a spreadsheet)",
            e.utf8_error().valid_up_to()
        ))
    })?;
    let root = csv.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
    let (rows, problems) = read_rows(&text, &root, opts.csv_paths_outside);
    if !problems.is_empty() {
        let mut message = format!("{} that cannot be used:", crate::engine::words::count(problems.len(), "row"));
        for p in problems.iter().take(LISTED) {
            message.push_str(&format!("\n  {p}"));
        }
        if problems.len() > LISTED {
            message.push_str(&format!("\n  and {} more", problems.len() - LISTED));
        }
        return Err(err(message));
    }
    if rows.is_empty() {
        return Err(err("has no rows; write one `path,label` row per image".into()));
    }
    let class_names: Vec<String> = rows.iter().map(|r| r.label.clone()).collect::<BTreeSet<_>>().into_iter().collect();
    let sample = |r: &Row| Sample {
        source: SampleSource::File(r.file.clone()),
        label: class_names.binary_search(&r.label).unwrap_or(0),
    };
    let dataset = |samples: Vec<Sample>| Dataset { class_names: class_names.clone(), samples };
    use crate::data::split_record::Split;
    let given = |s: Split| dataset(rows.iter().filter(|r| r.split == Some(s)).map(sample).collect());
    let (mut train, mut val) = (given(Split::Train), given(Split::Val));
    let unsplit = dataset(rows.iter().filter(|r| r.split.is_none()).map(sample).collect());
    let held_out = !unsplit.samples.is_empty();
    let note = if held_out {
        let (t, v) = split(unsplit, opts);
        let note = held_out_note(&t, &v, opts);
        train.samples.extend(t.samples);
        val.samples.extend(v.samples);
        note
    } else {
        format!("{} train / {} validation rows", train.samples.len(), val.samples.len())
    };
    Ok(Splits {
        description: format!("{} (labels CSV, {} rows; {note})", csv.display(), rows.len()),
        train,
        val,
        report: ScanReport::default(),
        root,
        held_out,
        labels_csv: Some(csv.to_path_buf()),
    })
}

/// The usable rows of `text` and a message for each row that is not (`file.csv line N: ...`).
fn read_rows(text: &str, root: &Path, outside: bool) -> (Vec<Row>, Vec<String>) {
    let mut lines = text.trim_start_matches('\u{feff}').lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let (mut rows, mut problems) = (Vec::new(), Vec::new());
    let Some((first_no, first)) = lines.next() else { return (rows, problems) };
    let columns = match fields(first).map(|h| columns_of(&h, root)) {
        Ok(Err(why)) => {
            problems.push(format!("line {}: {why}", first_no + 1));
            return (rows, problems);
        }
        Ok(Ok(columns)) => columns,
        Err(_) => None,
    };
    let mut all: Vec<(usize, &str)> = lines.collect();
    if columns.is_none() {
        all.insert(0, (first_no, first));
    }
    let columns = columns.unwrap_or(Columns { path: 0, label: 1, split: Some(2) });
    let mut first_line: std::collections::HashMap<PathBuf, usize> = std::collections::HashMap::new();
    for (no, line) in all {
        match row(line, &columns, root, outside) {
            Ok(r) => match first_line.get(&r.file) {
                // One file on two rows would be two samples, one of each label or split.
                Some(&earlier) => problems.push(format!(
                    "line {}: {} is already on line {earlier}; keep one row per image",
                    no + 1,
                    cell_path(line, &columns)
                )),
                None => {
                    first_line.insert(r.file.clone(), no + 1);
                    rows.push(r);
                }
            },
            Err(why) => problems.push(format!("line {}: {why}", no + 1)),
        }
    }
    (rows, problems)
}

/// The path cell of a row that parsed (for messages).
fn cell_path(line: &str, columns: &Columns) -> String {
    fields(line).ok().and_then(|c| c.get(columns.path).map(|p| p.trim().to_string())).unwrap_or_default()
}

/// What the first row is: a header naming the columns, or a data row (`Ok(None)`); an error
/// for a header that names no path or no label column. A row naming both is a header; one
/// naming some column is a header unless its first cell is an existing file under `root` (a
/// headerless file whose first label happens to be `target`).
fn columns_of(header: &[String], root: &Path) -> std::result::Result<Option<Columns>, String> {
    let find = |names: &[&str]| header.iter().position(|h| names.iter().any(|n| h.trim().eq_ignore_ascii_case(n)));
    let (path, label, split) = (find(&PATH_NAMES), find(&LABEL_NAMES), find(&["split", "subset"]));
    let first_is_file = header.first().is_some_and(|c| root.join(c.trim().replace('\\', "/")).is_file());
    match (path, label) {
        (Some(path), Some(label)) => Ok(Some(Columns { path, label, split })),
        (None, None) if split.is_none() => Ok(None),
        _ if first_is_file => Ok(None),
        _ => Err(format!(
            "the header {:?} names no {} column: name the image column one of {} and the class column one of {}",
            header.join(","),
            if path.is_none() { "path" } else { "label" },
            PATH_NAMES.join(", "),
            LABEL_NAMES.join(", ")
        )),
    }
}

/// One data row as a [`Row`], or why it cannot be used.
fn row(line: &str, columns: &Columns, root: &Path, outside: bool) -> std::result::Result<Row, String> {
    let cells = fields(line)?;
    let cell = |i: usize| cells.get(i).map(|c| c.trim()).unwrap_or("");
    if cells.len() < 2 {
        return Err(format!("{line:?} has {} field; write `path,label`", cells.len()));
    }
    let (path, label) = (cell(columns.path), cell(columns.label));
    if path.is_empty() {
        return Err("the path is empty".into());
    }
    if label.is_empty() {
        return Err(format!("{path} has an empty label; give every image a class"));
    }
    let split = match cell(columns.split.unwrap_or(usize::MAX)).to_ascii_lowercase().as_str() {
        "" => None,
        "train" | "training" => Some(crate::data::split_record::Split::Train),
        "val" | "valid" | "validation" | "test" | "dev" => Some(crate::data::split_record::Split::Val),
        other => return Err(format!("split {other:?} is not train, val or test")),
    };
    let file = resolve(path, root, outside)?;
    if file.is_dir() {
        return Err(format!("{path} is a folder, not an image file"));
    }
    if !file.is_file() {
        return Err(format!("{path} does not exist (looked for {}); fix the path or remove the row", file.display()));
    }
    Ok(Row { file, label: label.to_string(), split })
}

/// `path` (a CSV cell) as a file under `root`; refused when it leaves `root` and `outside` is off.
/// `\` separates like `/` (so `\etc\passwd` is the absolute `/etc/passwd`), and containment is
/// decided on the resolved path: `..` anywhere, and symbolic links inside `root` that point out
/// of it, leave it.
fn resolve(path: &str, root: &Path, outside: bool) -> std::result::Result<PathBuf, String> {
    let given = PathBuf::from(path.replace('\\', "/"));
    let file = if given.is_absolute() { given } else { root.join(given) };
    if !outside && !is_inside(&file, root) {
        return Err(format!(
            "{path} is outside the CSV file's folder {}; move the images under it, or set \
             data.csv_paths_outside = true if you trust the file",
            root.display()
        ));
    }
    Ok(file)
}

/// Whether `file` is inside `root` once resolved: both made absolute with symbolic links and
/// `..` resolved (`canonicalize`); a file that does not exist is judged by its path alone (a
/// `..` component leaves).
fn is_inside(file: &Path, root: &Path) -> bool {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let root = root.canonicalize().unwrap_or_else(|_| abs(root));
    match file.canonicalize() {
        Ok(real) => real.starts_with(&root),
        Err(_) => {
            let file = abs(file);
            !file.components().any(|c| matches!(c, Component::ParentDir)) && file.starts_with(&root)
        }
    }
}

/// The fields of one CSV line (RFC 4180, one line: a quoted field may hold commas and doubled
/// quotes, not a line break).
fn fields(line: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => {
                        return Err(
                            "a quoted field is not closed (a quote missing, or a line break inside quotes)".into()
                        );
                    }
                }
            }
            match chars.next() {
                None => {
                    out.push(field);
                    return Ok(out);
                }
                Some(',') => {}
                Some(c) => return Err(format!("{c:?} follows a closing quote; quote the whole field")),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        out.push(field);
                        return Ok(out);
                    }
                    Some(',') => break,
                    Some(c) => field.push(c),
                }
            }
        }
        out.push(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_follow_rfc_4180_on_one_line() {
        assert_eq!(fields("a,b,c").unwrap(), ["a", "b", "c"]);
        assert_eq!(fields("\"a,1\",\"say \"\"hi\"\"\",").unwrap(), ["a,1", "say \"hi\"", ""]);
        assert!(fields("\"open,b").is_err());
        assert!(fields("\"a\"x,b").is_err());
    }

    #[test]
    fn a_header_is_found_by_its_names_and_columns_by_name() {
        let root = Path::new("/nonexistent");
        let h = |s: &str| columns_of(&fields(s).unwrap(), root);
        let c = h("Split,Image_Path,extra,Label").unwrap().unwrap();
        assert_eq!((c.path, c.label, c.split), (1, 3, Some(0)));
        assert!(h("cat/1.png,cat").unwrap().is_none(), "a data row");
        assert!(h("species,image").unwrap_err().contains("names no label column"));
        assert!(h("filename,split").unwrap_err().contains("names no label column"));
        assert!(h("id,fold,label").unwrap_err().contains("names no path column"));
    }

    #[test]
    fn paths_leaving_the_folder_are_refused_unless_allowed() {
        let root = Path::new("/data/set");
        assert_eq!(resolve("cat\\1.png", root, false).unwrap(), Path::new("/data/set/cat/1.png"));
        assert!(resolve("../secret.png", root, false).unwrap_err().contains("outside the CSV file's folder"));
        assert!(resolve("/etc/passwd", root, false).is_err());
        assert!(resolve("\\etc\\passwd", root, false).is_err(), "a leading backslash is the root");
        assert!(resolve("/data/set/../../etc/passwd", root, false).is_err(), "an absolute path with ..");
        assert_eq!(resolve("/data/set/a.png", root, false).unwrap(), Path::new("/data/set/a.png"));
        assert_eq!(resolve("../x.png", root, true).unwrap(), Path::new("/data/set/../x.png"));
    }
}
