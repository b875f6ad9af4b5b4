//! Image files by name: the extensions taken as images, the image formats no decoder here
//! reads (named with the fix), and what a scan says about files of either kind.

use std::path::Path;

use super::ScanReport;

/// File extensions taken as images (compared lower-cased): every name in use for the formats the
/// decoders read (JPEG's `.jfif`, `.jpe`, `.jif`, `.jfi`, `.pjpeg`, `.pjp`; animated PNG's
/// `.apng`; Windows bitmaps' `.dib`). The format itself is read from the content
/// ([`crate::data::image_io`]), so a PNG named `.jpg` still loads.
pub const IMAGE_EXTENSIONS: [&str; 16] = [
    "jpg", "jpeg", "jfif", "jpe", "jif", "jfi", "pjpeg", "pjp", "png", "apng", "bmp", "dib", "webp", "gif", "tif",
    "tiff",
];

/// Image formats the decoders do not read, by extension, with why a scan ignored such a file
/// and the fix (content of these formats is named the same way by [`crate::data::image_io`]).
const UNSUPPORTED_FORMATS: [(&[&str], &str); 6] = [
    (
        &["heic", "heif", "hif"],
        "HEIC/HEIF photo (an iPhone's default format): not supported; convert it to JPEG or PNG",
    ),
    (&["avif"], "AVIF image: not supported; convert it to JPEG or PNG"),
    (&["jxl"], "JPEG XL image: not supported; convert it to JPEG or PNG"),
    (
        &["dng", "cr2", "cr3", "nef", "nrw", "arw", "orf", "rw2", "raf", "pef", "srw"],
        "camera RAW file: not supported; export it as JPEG or PNG",
    ),
    (&["psd"], "Photoshop document: not supported; export it as JPEG or PNG"),
    (&["svg", "svgz"], "SVG vector image: not supported; render it as PNG"),
];

/// Why a scan ignored a file with another extension (one not in [`IMAGE_EXTENSIONS`] nor a known
/// unsupported image format).
pub const IGNORED_EXTENSION: &str =
    "not an image extension (jpg, jpeg, jfif, jpe, png, bmp, gif, webp, tif, tiff, ...)";

/// Why a scan ignores a file that is not junk and has no image extension: an image format the
/// decoders do not read, named with its fix, or [`IGNORED_EXTENSION`].
pub fn ignored_because(path: &Path) -> &'static str {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).unwrap_or_default();
    UNSUPPORTED_FORMATS.iter().find(|(exts, _)| exts.contains(&ext.as_str())).map_or(IGNORED_EXTENSION, |(_, why)| why)
}

/// Whether a scan's reason names an image format the decoders do not read.
pub fn is_unsupported_format(reason: &str) -> bool {
    UNSUPPORTED_FORMATS.iter().any(|(_, why)| *why == reason)
}

/// The empty class folders named for a refusal, each with the unsupported files it holds (by
/// `report.ignored`, its path under `root/<class>`), e.g. `iphone (4 files: HEIC/HEIF photo
/// ...)`.
pub fn describe_empty_classes(root: &Path, empty: &[String], report: &ScanReport) -> String {
    let describe = |class: &String| {
        let folder = root.join(class);
        let unsupported: Vec<&str> = report
            .ignored
            .iter()
            .filter(|(p, why)| p.starts_with(&folder) && is_unsupported_format(why))
            .map(|(_, why)| *why)
            .collect();
        match unsupported.first() {
            None => class.clone(),
            Some(first) => {
                format!("{class} (its {} files cannot be read: {first})", unsupported.len())
            }
        }
    };
    empty.iter().map(describe).collect::<Vec<_>>().join(", ")
}

/// Does this file name have an image extension (any case)?
pub fn has_image_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}
