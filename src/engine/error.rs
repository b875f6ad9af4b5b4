//! The engine's error type: every variant names the file, key or setting at fault and the fix.

use std::path::PathBuf;

/// Errors the engine returns. Each message is one line that names what is wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config file or override that cannot be used.
    #[error("config {source_name}: {message}")]
    Config {
        /// The file (or `--set` override) the problem is in.
        source_name: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A dataset that cannot be used as a whole (missing folder, empty class, bad layout).
    #[error("dataset {}: {message}", path.display())]
    Dataset {
        /// The folder or file at fault.
        path: PathBuf,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// One image that cannot be decoded or used.
    #[error("image {}: {fault}", path.display())]
    Image {
        /// The image file.
        path: PathBuf,
        /// Why it was rejected.
        fault: ImageFault,
    },
    /// An IDX (MNIST format) file that is malformed.
    #[error("IDX file {}: {message}", path.display())]
    Idx {
        /// The IDX file.
        path: PathBuf,
        /// What is malformed.
        message: String,
    },
    /// Preprocess settings that cannot produce a training image from a given source size.
    #[error("preprocess: {0}")]
    Preprocess(String),
    /// The GPU adapter or CPU backend failed (out of memory, buffer over the adapter limit, lost device).
    #[error("device: {0}")]
    Device(String),
    /// A configuration whose predicted memory does not fit the budget.
    #[error("memory: {0}")]
    Memory(String),
    /// Training diverged (non-finite loss or gradients).
    #[error("training diverged: {0}")]
    Diverged(String),
    /// A checkpoint, export or metrics file could not be read or written.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        message: String,
    },
    /// A checkpoint folder whose files are missing or do not match their recorded checksums.
    #[error("{} {message}", path.display())]
    Checkpoint {
        /// The damaged or missing file (or the folder).
        path: PathBuf,
        /// What is wrong with it, e.g. "is damaged (0 bytes, ...)".
        message: String,
    },
    /// A training worker process failed: the error it explained, or its crash report.
    #[error("{0}")]
    Worker(String),
    /// A job panicked; the engine session lives on and the run folder keeps its last checkpoint.
    #[error("the engine crashed ({0})")]
    Crashed(String),
    /// The run was stopped by the user; the last checkpoint is intact.
    #[error("stopped by the user")]
    Stopped,
}

/// Why one image file was rejected: the typed reason inside [`Error::Image`]. `check-data`
/// groups skipped files by [`ImageFault::kind`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImageFault {
    /// The file could not be read (permissions, vanished, a folder).
    #[error("cannot read: {0}")]
    Unreadable(String),
    /// The file has no bytes.
    #[error("empty file (0 bytes)")]
    Empty,
    /// A format recognised by its content that no decoder here reads (HEIC, AVIF, JPEG XL, ...).
    #[error("{format} is not supported; convert it to JPEG or PNG")]
    Unsupported {
        /// The format as users know it, with what identified it, e.g. "HEIF/HEIC image (brand
        /// `heic`)".
        format: String,
    },
    /// Text, or bytes that match no supported format.
    #[error("not an image: {0}")]
    NotAnImage(&'static str),
    /// The header cannot be parsed.
    #[error("unreadable {format} header: {message}")]
    BadHeader {
        /// The format the content was recognised as.
        format: String,
        /// The decoder's reason.
        message: String,
    },
    /// Width x height over `data.max_image_pixels`, checked before decoding.
    #[error(
        "{width}x{height} is {:.1} megapixels, over the cap of {:.1} (data.max_image_pixels); \
         downscale the file or raise the cap",
        *width as f64 * *height as f64 / 1e6,
        *max_pixels as f64 / 1e6
    )]
    OverPixelCap {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// The cap, in pixels.
        max_pixels: u64,
    },
    /// A JPEG whose data ends early (see [`crate::data::image_io::decode_image`]'s rule 5).
    #[error("truncated or corrupt JPEG ({0}); the decoder would invent the missing rows")]
    TruncatedJpeg(String),
    /// Decoded, but the preprocess geometry cannot use it (e.g. smaller than the crop).
    #[error("{0} (data.preprocess)")]
    Unusable(String),
    /// The decoder failed on the pixel data.
    #[error("cannot decode {format}: {message}")]
    Corrupt {
        /// The format the content was recognised as.
        format: String,
        /// The decoder's reason.
        message: String,
    },
}

impl ImageFault {
    /// A short label of the kind of fault, the same for every file with that fault (what
    /// `check-data` groups skipped files by).
    pub fn kind(&self) -> &'static str {
        match self {
            ImageFault::Unreadable(_) => "cannot read",
            ImageFault::Empty => "empty file",
            ImageFault::Unsupported { .. } => "format not supported (convert them to JPEG or PNG)",
            ImageFault::NotAnImage(_) => "not an image",
            ImageFault::BadHeader { .. } => "unreadable header",
            ImageFault::OverPixelCap { .. } => "over data.max_image_pixels",
            ImageFault::TruncatedJpeg(_) => "truncated or corrupt JPEG",
            ImageFault::Corrupt { .. } => "cannot decode",
            ImageFault::Unusable(_) => "unusable with data.preprocess",
        }
    }
}

impl Error {
    /// An [`Error::Io`] for `path` from any displayable cause.
    pub fn io(path: impl Into<PathBuf>, cause: impl std::fmt::Display) -> Self {
        Error::Io { path: path.into(), message: cause.to_string() }
    }

    /// An [`Error::Io`] for a file vramfit writes, with the fix for the kinds of failure users
    /// meet: a read-only or foreign folder, a full disk.
    pub fn write(path: impl Into<PathBuf>, e: &std::io::Error) -> Self {
        use std::io::ErrorKind;
        let fix = match e.kind() {
            ErrorKind::ReadOnlyFilesystem | ErrorKind::PermissionDenied => {
                ": vramfit cannot write here; choose a writable folder (copy a run kept on read-only media \
                 elsewhere to continue it, or export it with --out)"
            }
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded => {
                ": the disk is full; free space and run again (the last checkpoint is intact)"
            }
            _ => "",
        };
        Error::Io { path: path.into(), message: format!("{e}{fix}") }
    }

    /// An [`Error::Device`] from a GPU runtime error, kept to one line: the runtime's first line
    /// and its root cause (burn's execution errors print a chain of causes, skip records and
    /// backtrace placeholders over dozens of lines).
    pub fn device(cause: &impl std::fmt::Debug) -> Self {
        Error::Device(one_line_cause(&format!("{cause:?}")))
    }
}

/// The first line of a multi-line runtime error and its last meaningful cause, joined by "; ".
pub fn one_line_cause(text: &str) -> String {
    let noise = |l: &str| {
        l.is_empty()
            || l.starts_with("Caused by")
            || l.starts_with("No backtrace")
            || l.starts_with("Asked at")
            || l.starts_with("skipped `")
            || l.starts_with('(')
            || l.starts_with("stack backtrace")
            || l.split(':').next().is_some_and(|n| n.trim().parse::<u32>().is_ok())
    };
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !noise(l)).collect();
    match (lines.first(), lines.last()) {
        (Some(first), Some(last)) if first != last => format!("{first}; cause: {last}"),
        (Some(first), _) => (*first).to_string(),
        _ => text.trim().to_string(),
    }
}

/// Result alias for the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    #[test]
    fn runtime_errors_become_one_line_with_the_root_cause() {
        let text = "An error happened during execution\nCaused by:\n  Several failures at once\nCaused by:\n  \
                    skipped `ElemwiseFuse`: it needed memory\n  (21 older skip record(s) were dropped)\nCaused by:\n  \
                    can't allocate buffer of size: 192000000\nNo backtrace available\nAsked at:\nNo backtrace available";
        assert_eq!(
            super::one_line_cause(text),
            "An error happened during execution; cause: can't allocate buffer of size: 192000000"
        );
        assert_eq!(super::one_line_cause("lost device"), "lost device");
    }

    /// C38 / C44: a read-only run folder and a full disk are named with the way on, not as a
    /// bare OS error (every file vramfit writes goes through [`super::Error::write`]).
    #[test]
    fn c38_c44_read_only_folders_and_full_disks_get_the_fix_in_every_write_error() {
        use std::io::{Error as IoError, ErrorKind};
        for kind in [ErrorKind::ReadOnlyFilesystem, ErrorKind::PermissionDenied] {
            let e = super::Error::write("runs/a/.vramfit.lock", &IoError::from(kind)).to_string();
            assert!(e.starts_with("runs/a/.vramfit.lock: ") && e.contains("choose a writable folder"), "{e}");
        }
        let full = super::Error::write("m.csv", &IoError::from(ErrorKind::StorageFull)).to_string();
        assert!(full.contains("the disk is full") && full.contains("the last checkpoint is intact"), "{full}");
        let other = super::Error::write("m.csv", &IoError::from(ErrorKind::NotFound)).to_string();
        assert!(!other.contains("writable") && !other.contains("disk is full"), "{other}");
    }
}
