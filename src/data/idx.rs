//! IDX files (the MNIST / Fashion-MNIST format, LeCun et al.), raw or gzipped.
//!
//! Layout: a 4-byte magic `00 00 <type> <ndim>` (type 0x08 = unsigned byte), `ndim` big-endian
//! u32 dimensions, then the payload. Images are `ndim = 3` (`count x rows x cols`, magic 2051),
//! labels `ndim = 1` (magic 2049). Gzip is detected by its bytes (`1f 8b`), not the file name.
//! Every size is checked against the bytes actually present before anything is allocated from it.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::engine::error::{Error, Result};

/// Magic of an IDX image file (u8, 3 dimensions).
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic of an IDX label file (u8, 1 dimension).
pub const LABELS_MAGIC: u32 = 0x0000_0801;
/// Decompressed size above which a gzip IDX file is refused (the full MNIST set is 47 MB).
pub const MAX_DECOMPRESSED_BYTES: u64 = 2 << 30;

/// Images of an IDX file.
#[derive(Clone, Debug, PartialEq)]
pub struct IdxImages {
    /// Number of images.
    pub count: usize,
    /// Height in pixels.
    pub rows: usize,
    /// Width in pixels.
    pub cols: usize,
    /// `count x rows x cols` gray values, row-major.
    pub pixels: Vec<u8>,
}

impl IdxImages {
    /// Gray values of image `i`, `rows x cols`.
    pub fn image(&self, i: usize) -> &[u8] {
        let n = self.rows * self.cols;
        &self.pixels[i * n..(i + 1) * n]
    }

    /// Image `i` as RGB (grey in all three channels), `cols x rows`.
    pub fn rgb_image(&self, i: usize) -> image::RgbImage {
        let gray = self.image(i);
        image::RgbImage::from_fn(self.cols as u32, self.rows as u32, |x, y| {
            let v = gray[y as usize * self.cols + x as usize];
            image::Rgb([v, v, v])
        })
    }
}

/// Un-gzips `raw` when it starts with the gzip magic, else returns it unchanged.
///
/// # Errors
/// A reason for corrupt gzip or output over [`MAX_DECOMPRESSED_BYTES`].
fn decompress_if_gzip(raw: Vec<u8>) -> std::result::Result<Vec<u8>, String> {
    if raw.len() < 2 || raw[0] != 0x1f || raw[1] != 0x8b {
        return Ok(raw);
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(raw.as_slice())
        .take(MAX_DECOMPRESSED_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("corrupt gzip data: {e}"))?;
    if out.len() as u64 > MAX_DECOMPRESSED_BYTES {
        return Err(format!("decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes"));
    }
    Ok(out)
}

fn idx_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Idx { path: path.into(), message: message.into() }
}

/// Parses the header and checks magic, dimension count and payload length.
fn parse_header(bytes: &[u8], want_magic: u32, want_ndim: usize) -> std::result::Result<Vec<usize>, String> {
    if bytes.len() < 4 + 4 * want_ndim {
        if bytes.starts_with(b"<") || bytes.iter().take(64).all(|b| b.is_ascii()) && !bytes.is_empty() && bytes[0] != 0
        {
            return Err("not IDX or gzip data (looks like text or HTML; re-download the file)".into());
        }
        return Err(format!("too short for a header ({} bytes, need {})", bytes.len(), 4 + 4 * want_ndim));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        if bytes[2] == 0 && bytes[3] == 0 && bytes[1] == 0x08 {
            let swapped = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            return Err(format!(
                "little-endian header (magic reads {swapped} byte-swapped); IDX is big-endian, re-export the file"
            ));
        }
        if bytes.starts_with(b"<") || bytes[..4].iter().all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace()) {
            return Err("not IDX or gzip data (looks like text or HTML; re-download the file)".into());
        }
        return Err(format!("not IDX data: magic bytes {:02x} {:02x} must be 00 00", bytes[0], bytes[1]));
    }
    if bytes[2] != 0x08 {
        return Err(format!("element type 0x{:02x} is not unsigned byte (0x08)", bytes[2]));
    }
    let ndim = bytes[3] as usize;
    let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if ndim != want_ndim {
        let what = if want_ndim == 3 { "images" } else { "labels" };
        if (want_ndim == 3 && ndim == 1) || (want_ndim == 1 && ndim == 3) {
            let other = if ndim == 1 { " (a labels file?)" } else { " (an images file?)" };
            return Err(format!("wrong magic: expected {want_magic} got {magic}{other}"));
        }
        return Err(format!("{what} must be {want_ndim}-D, found {ndim}-D (magic {magic})"));
    }
    if bytes.len() < 4 + 4 * ndim {
        return Err(format!("too short for a header ({} bytes)", bytes.len()));
    }
    let dims: Vec<usize> = (0..ndim)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().unwrap_or([0; 4])) as usize)
        .collect();
    let header = 4 + 4 * ndim;
    let expected = dims.iter().try_fold(1usize, |acc, d| acc.checked_mul(*d)).ok_or("dimensions overflow")?;
    let found = bytes.len() - header;
    if found != expected {
        let kind = if found < expected { "truncated" } else { "trailing data" };
        return Err(format!("{kind}: header {dims:?} needs expected {expected} payload bytes, found {found}"));
    }
    Ok(dims)
}

/// Parses an IDX image file's (already decompressed) bytes.
///
/// # Errors
/// A reason: wrong magic, wrong dimension count, header or payload size mismatch.
fn parse_images(bytes: &[u8]) -> std::result::Result<IdxImages, String> {
    let dims = parse_header(bytes, IMAGES_MAGIC, 3)?;
    let (count, rows, cols) = (dims[0], dims[1], dims[2]);
    if rows == 0 || cols == 0 {
        return Err(format!("images are {rows}x{cols} pixels"));
    }
    Ok(IdxImages { count, rows, cols, pixels: bytes[16..].to_vec() })
}

/// Parses an IDX label file's (already decompressed) bytes.
///
/// # Errors
/// As [`parse_images`].
fn parse_labels(bytes: &[u8]) -> std::result::Result<Vec<u8>, String> {
    parse_header(bytes, LABELS_MAGIC, 1)?;
    Ok(bytes[8..].to_vec())
}

/// Loads an image file and its label file and checks they agree.
///
/// # Errors
/// [`Error::Idx`] naming the file at fault.
pub fn load_pair(images: &Path, labels: &Path) -> Result<(IdxImages, Vec<u8>)> {
    let read = |path: &Path| std::fs::read(path).map_err(|e| idx_err(path, format!("cannot read: {e}")));
    parse_pair(read(images)?, read(labels)?, images, labels)
}

/// [`load_pair`] on the files' bytes, already read (gzip or not): where there is no file system
/// (a browser); `images` and `labels` name the files in errors.
///
/// # Errors
/// [`Error::Idx`] naming the file at fault.
pub fn parse_pair(
    image_bytes: Vec<u8>,
    label_bytes: Vec<u8>,
    images: &Path,
    labels: &Path,
) -> Result<(IdxImages, Vec<u8>)> {
    let image_bytes = decompress_if_gzip(image_bytes).map_err(|m| idx_err(images, m))?;
    let label_bytes = decompress_if_gzip(label_bytes).map_err(|m| idx_err(labels, m))?;
    let imgs = parse_images(&image_bytes).map_err(|m| idx_err(images, m))?;
    let labs = parse_labels(&label_bytes).map_err(|m| idx_err(labels, m))?;
    if imgs.count != labs.len() {
        return Err(idx_err(
            images,
            format!("count mismatch: {} images vs {} labels in {}", imgs.count, labs.len(), labels.display()),
        ));
    }
    Ok((imgs, labs))
}

/// Finds `<prefix>-images-idx3-ubyte` and `<prefix>-labels-idx1-ubyte` in `dir`, with or without
/// `.gz`, also in the dotted form (`train-images.idx3-ubyte`) some unpackers produce.
///
/// `prefix` is `train` or `t10k`. Returns `None` when either file is missing.
pub fn find_split(dir: &Path, prefix: &str) -> Option<(PathBuf, PathBuf)> {
    let find = |kind: &str, nd: u8| {
        [format!("{prefix}-{kind}-idx{nd}-ubyte"), format!("{prefix}-{kind}.idx{nd}-ubyte")]
            .into_iter()
            .flat_map(|n| [n.clone(), format!("{n}.gz")])
            .map(|n| dir.join(n))
            .find(|p| p.is_file())
    };
    Some((find("images", 3)?, find("labels", 1)?))
}

/// The names [`find_split`] looks for, for error messages.
pub fn expected_names(prefix: &str) -> String {
    format!("{prefix}-images-idx3-ubyte[.gz] and {prefix}-labels-idx1-ubyte[.gz]")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images_file(count: u32, payload: usize) -> Vec<u8> {
        let mut b = vec![0, 0, 8, 3];
        for d in [count, 2, 2] {
            b.extend_from_slice(&d.to_be_bytes());
        }
        b.extend(std::iter::repeat_n(7u8, payload));
        b
    }

    #[test]
    fn parses_a_small_file() {
        let imgs = parse_images(&images_file(3, 12)).unwrap();
        assert_eq!((imgs.count, imgs.rows, imgs.cols), (3, 2, 2));
        assert_eq!(imgs.image(2), &[7, 7, 7, 7]);
    }

    #[test]
    fn a_huge_claimed_count_is_refused_without_allocating() {
        let err = parse_images(&images_file(u32::MAX, 12)).unwrap_err();
        assert!(err.contains("truncated"), "{err}");
    }
}
