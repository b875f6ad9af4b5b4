//! Paths as users give them: plain paths, or `file://` URIs as terminals and file managers paste
//! a dropped file (`file:///home/me/my%20data/Foto%20M%C3%A4rz.png`, also `file://localhost/...`).
//! Every command-line path argument and the app's drop handler go through [`normalize`].

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The path a user meant: a `file://` URI becomes the local path it names (percent-decoded, so
/// `%20` is a space and `%C3%A4` an `ä`; bytes that are not UTF-8 are kept as they are on Unix);
/// anything else is returned unchanged. URIs of other hosts are left as given (and then fail
/// with "not found" naming them).
pub fn normalize(path: &Path) -> PathBuf {
    let raw = path.as_os_str().as_encoded_bytes();
    let rest = if let Some(r) = raw.strip_prefix(b"file://localhost/") {
        r
    } else if let Some(r) = raw.strip_prefix(b"file:///") {
        r
    } else {
        return path.to_path_buf();
    };
    let mut decoded = b"/".to_vec();
    decoded.extend(percent_encoding::percent_decode(rest));
    bytes_to_path(decoded)
}

#[cfg(unix)]
fn bytes_to_path(bytes: Vec<u8>) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(bytes))
}

#[cfg(not(unix))]
fn bytes_to_path(bytes: Vec<u8>) -> PathBuf {
    // Windows URIs look like file:///C:/Users/...: drop the leading slash before the drive.
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let text = if text.len() > 2 && text.as_bytes()[2] == b':' { text[1..].to_string() } else { text };
    PathBuf::from(text)
}

/// A clap value parser for path arguments that applies [`normalize`] and accepts any bytes the
/// operating system allows (not only UTF-8).
#[derive(Clone, Copy, Debug, Default)]
pub struct UserPathParser;

impl clap::builder::TypedValueParser for UserPathParser {
    type Value = PathBuf;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<Self::Value, clap::Error> {
        Ok(normalize(Path::new(value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_become_paths_and_plain_paths_stay() {
        let cases = [
            ("file:///tmp/my%20data/Foto%20M%C3%A4rz%201.png", "/tmp/my data/Foto März 1.png"),
            ("file://localhost/tmp/a%2Bb.png", "/tmp/a+b.png"),
            ("/tmp/100% sure.png", "/tmp/100% sure.png"),
            ("relative/file%20name.png", "relative/file%20name.png"),
            ("http://example.com/x.png", "http://example.com/x.png"),
        ];
        for (given, want) in cases {
            assert_eq!(normalize(Path::new(given)), PathBuf::from(want), "{given}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn percent_encoded_bytes_that_are_not_utf8_survive() {
        use std::os::unix::ffi::OsStrExt;
        let p = normalize(Path::new("file:///tmp/caf%E9"));
        assert_eq!(p.as_os_str().as_bytes(), b"/tmp/caf\xe9");
    }
}
