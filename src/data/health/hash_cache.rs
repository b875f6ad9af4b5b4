//! The duplicate finder's hashes kept between scans, beside the decoded-image cache: one file per
//! dataset folder, `<image cache>/hashes/<xxh3-64 of the folder's absolute path>.tsv`, holding
//! one line per image file of the last scan:
//! `size \t mtime_ns \t bytes \t pixels \t perceptual \t mirrored \t flat \t colour \t path` (hex
//! hashes; a line of another layout, from an older vramfit, is hashed again).
//! A line is used only when the file's size and modification time still match, so an edited
//! image is hashed again. Each scan rewrites the file with the dataset's present files (so it
//! never grows past the dataset: about 100 bytes an image), atomically; a file it cannot write is
//! skipped, as the image cache skips its own (the scan never fails for its cache).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::hashes::{ImageHashes, Perceptual, WORDS};

/// A file's identity for the cache: its size in bytes and modification time (ns since 1970).
pub type FileStamp = (u64, u128);

/// The size and modification time of `path`; `None` when the file system does not say.
pub fn stamp(path: &Path) -> Option<FileStamp> {
    let meta = std::fs::metadata(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    Some((meta.len(), mtime))
}

/// The hashes of one dataset folder's files, as last written.
#[derive(Debug, Default)]
pub struct HashCache {
    file: Option<PathBuf>,
    entries: HashMap<PathBuf, (FileStamp, ImageHashes)>,
}

impl HashCache {
    /// The cache of dataset folder `root` in the image cache folder `dir` (`None`: kept in
    /// memory only, empty). A missing or damaged file reads as empty (lines that do not parse
    /// are dropped).
    pub fn open(dir: Option<&Path>, root: &Path) -> Self {
        let Some(dir) = dir else { return Self::default() };
        let abs = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
        let key = xxhash_rust::xxh3::xxh3_64(format!("{abs:?}").as_bytes());
        let file = dir.join("hashes").join(format!("{key:016x}.tsv"));
        let entries = std::fs::read_to_string(&file).map(|text| text.lines().filter_map(parse_line).collect());
        Self { file: Some(file), entries: entries.unwrap_or_default() }
    }

    /// The cached hashes of `path` when its stamp is still `stamp`.
    pub fn get(&self, path: &Path, stamp: FileStamp) -> Option<ImageHashes> {
        self.entries.get(path).filter(|(s, _)| *s == stamp).map(|(_, h)| *h)
    }

    /// Writes `files` (path, stamp, hashes) as the folder's cache, replacing the last scan's.
    /// Returns whether it was written (a read-only or full disk is no error: the next scan
    /// hashes again).
    pub fn store(&self, files: &[(PathBuf, FileStamp, ImageHashes)]) -> bool {
        let Some(file) = &self.file else { return false };
        let mut text = String::with_capacity(files.len() * 120);
        for (path, (size, mtime), h) in files {
            // Paths that are not UTF-8 (or hold a tab or newline) are not cached: hashed each scan.
            let Some(p) = path.to_str().filter(|p| !p.contains(['\t', '\n', '\r'])) else { continue };
            let _ = writeln!(
                text,
                "{size}\t{mtime}\t{:032x}\t{:032x}\t{}\t{}\t{}\t{:02x}{:02x}{:02x}\t{p}",
                h.bytes,
                h.pixels,
                hex(&h.perceptual),
                hex(&h.mirrored),
                u8::from(h.flat),
                h.colour[0],
                h.colour[1],
                h.colour[2]
            );
        }
        crate::atomic_file::write_atomic(file, text.as_bytes()).is_ok()
    }
}

/// A perceptual hash as hex, word 0 first.
fn hex(h: &Perceptual) -> String {
    h.iter().map(|w| format!("{w:016x}")).collect()
}

/// [`hex`] read back; `None` unless it is exactly that.
fn unhex(s: &str) -> Option<Perceptual> {
    let mut h = [0u64; WORDS];
    if s.len() != 16 * WORDS {
        return None;
    }
    for (i, w) in h.iter_mut().enumerate() {
        *w = u64::from_str_radix(s.get(16 * i..16 * (i + 1))?, 16).ok()?;
    }
    Some(h)
}

/// One cache line back as (path, (stamp, hashes)); `None` when it does not parse.
fn parse_line(line: &str) -> Option<(PathBuf, (FileStamp, ImageHashes))> {
    let mut f = line.splitn(9, '\t');
    let size = f.next()?.parse().ok()?;
    let mtime = f.next()?.parse().ok()?;
    let bytes = u128::from_str_radix(f.next()?, 16).ok()?;
    let pixels = u128::from_str_radix(f.next()?, 16).ok()?;
    let perceptual = unhex(f.next()?)?;
    let mirrored = unhex(f.next()?)?;
    let flat = match f.next()? {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    let colour = f.next().filter(|c| c.len() == 6)?;
    let channel = |i: usize| u8::from_str_radix(colour.get(2 * i..2 * i + 2)?, 16).ok();
    let colour = [channel(0)?, channel(1)?, channel(2)?];
    let path = PathBuf::from(f.next()?);
    Some((path, ((size, mtime), ImageHashes { bytes, pixels, perceptual, mirrored, flat, colour })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_hashes_read_back_while_the_stamp_matches() {
        let dir = tempfile::tempdir().unwrap();
        let h = ImageHashes {
            bytes: 1 << 100,
            pixels: 7,
            perceptual: [u64::MAX, 1, 2, 3],
            mirrored: [3; WORDS],
            flat: true,
            colour: [1, 128, 255],
        };
        let cache = HashCache::open(Some(dir.path()), Path::new("/data/set"));
        let files = vec![(PathBuf::from("/data/set/a b/c.png"), (10, 99), h)];
        assert!(cache.store(&files));
        let again = HashCache::open(Some(dir.path()), Path::new("/data/set"));
        assert_eq!(again.get(Path::new("/data/set/a b/c.png"), (10, 99)), Some(h));
        assert_eq!(again.get(Path::new("/data/set/a b/c.png"), (10, 100)), None, "a newer file is hashed again");
        assert_eq!(HashCache::open(Some(dir.path()), Path::new("/data/other")).get(&files[0].0, (10, 99)), None);
    }

    #[test]
    fn a_damaged_line_is_dropped_not_misread() {
        let h = "0".repeat(16 * WORDS);
        let line =
            |bytes: &str, p: &str, flat: &str| format!("10\t99\t{bytes}\t7\t{p}\t{h}\t{flat}\t0a0b0c\t/x\ty.png");
        assert!(parse_line(&line("1", &h, "0")).is_some_and(|(p, _)| p == Path::new("/x\ty.png")));
        assert!(parse_line(&line("zz", &h, "0")).is_none());
        assert!(parse_line(&line("1", &h, "2")).is_none());
        assert!(parse_line(&line("1", &h[1..], "0")).is_none(), "a cut hash");
        assert!(parse_line("10\t99\t1\t7").is_none());
    }
}
