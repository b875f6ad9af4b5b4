//! The decoded-image cache: each image file once decoded and scaled to `load_size` (the output
//! of [`PreprocessConfig::resize_stage`](crate::data::preprocess::PreprocessConfig::resize_stage)),
//! kept as 8-bit RGB, so later epochs and later runs on the same folder skip the decode and
//! the resize and only crop, augment and normalize.
//!
//! Two tiers:
//! - **RAM**: up to `data.cache_ram_mib`; beyond it the oldest entries leave RAM first.
//! - **Disk**: one file per image in `data.cache_dir` (default `$XDG_CACHE_HOME/vramfit/images`
//!   or `~/.cache/vramfit/images`), up to `data.cache_disk_mib`. Opening the cache trims the
//!   folder to 3/4 of the bound, least recently used entries first; during a run, once the
//!   bound is reached, new images are no longer written (a run never evicts what it reads).
//!
//! An entry's key is the file's absolute path, its size in bytes, its modification time
//! (nanoseconds) and the geometry ([`SamplePipeline::cache_geometry`](crate::data::pipeline::SamplePipeline::cache_geometry)):
//! a file that changes, or another `load_size`, misses the cache. The disk file stores the whole
//! key and is used only when the key matches byte for byte, so a hash collision or a stale file
//! is a miss, never a wrong image. The cache never fails a run: a file it cannot write (disk
//! full, read-only folder) is counted in [`CacheStats::write_errors`] and skipped.
//!
//! Disk entries are read with one `read` whose buffer becomes the image, rather than
//! memory-mapped: an entry (196 KiB at 256 px) is copied into the batch at once, and mapped
//! pages would count in the process's resident memory until unmapped. Each entry carries a
//! CRC-32 of its pixels, so a file damaged by a crash is a miss, not a black image.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use image::RgbImage;
use serde::Serialize;

use crate::config::DataConfig;

/// First bytes of a disk entry; the version changes when the stored image would.
const MAGIC: &[u8; 8] = b"VFIMG\x002\n";

/// Bytes of a disk entry besides its key and pixels: magic, key length, width, height, CRC-32.
const ENTRY_HEADER: usize = MAGIC.len() + 16;

/// Name prefix of an entry being written (a killed run's leftovers are removed on open).
const TMP_PREFIX: &str = ".tmp-";

/// Hits, misses and sizes of one [`ImageCache`] since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Images served from RAM.
    pub ram_hits: u64,
    /// Images read from the disk tier (then kept in RAM).
    pub disk_hits: u64,
    /// Images decoded (not in either tier).
    pub misses: u64,
    /// Bytes of pixels held in RAM.
    pub ram_bytes: u64,
    /// Images held in RAM.
    pub ram_entries: u64,
    /// Bytes in the cache folder (all entries, this run's and earlier ones).
    pub disk_bytes: u64,
    /// Entries that could not be written to disk (skipped; the run goes on).
    pub write_errors: u64,
}

/// A bounded two-tier cache of resized images, shared by the loader's worker threads.
#[derive(Debug)]
pub struct ImageCache {
    ram_bound: u64,
    disk_bound: u64,
    dir: Option<PathBuf>,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    ram: HashMap<String, Arc<RgbImage>>,
    order: VecDeque<String>,
    stats: CacheStats,
}

impl ImageCache {
    /// A cache holding up to `ram_bytes` of pixels in RAM and `disk_bytes` in `dir` (`None`:
    /// RAM only). The folder is created on first write. Opening it removes a killed run's
    /// half-written files and, when the folder holds more than 3/4 of `disk_bytes`, the entries
    /// least recently used (by modification time, which a read renews) until it holds 3/4, so
    /// every run has room for new images; the rest counts against `disk_bytes`.
    pub fn new(ram_bytes: u64, disk_bytes: u64, dir: Option<PathBuf>) -> Self {
        let disk_used = dir.as_deref().map_or(0, |d| prune(d, disk_bytes - disk_bytes / 4));
        let stats = CacheStats { disk_bytes: disk_used, ..CacheStats::default() };
        Self {
            ram_bound: ram_bytes,
            disk_bound: disk_bytes,
            dir,
            inner: Mutex::new(Inner { stats, ..Inner::default() }),
        }
    }

    /// The cache `data` configures, or `None` when both bounds are 0.
    pub fn from_config(data: &DataConfig) -> Option<Self> {
        if data.cache_ram_mib == 0 && data.cache_disk_mib == 0 {
            return None;
        }
        Some(Self::new(data.cache_ram_mib << 20, data.cache_disk_mib << 20, disk_folder(data)))
    }

    /// The counters so far.
    pub fn stats(&self) -> CacheStats {
        self.lock().stats
    }

    /// The cached image of `path` under `geometry`, or `make()`'s result, which is then cached.
    /// A file whose size or modification time cannot be read is not cached.
    ///
    /// # Errors
    /// `make`'s error (nothing is cached).
    pub fn get_or_insert_with<E>(
        &self,
        path: &Path,
        geometry: &str,
        make: impl FnOnce() -> Result<RgbImage, E>,
    ) -> Result<Arc<RgbImage>, E> {
        let Some(key) = entry_key(path, geometry) else { return make().map(Arc::new) };
        if let Some(img) = self.ram_get(&key) {
            return Ok(img);
        }
        let file = self.dir.as_deref().map(|d| entry_file(d, &key));
        if let Some(img) = file.as_deref().and_then(|f| read_entry(f, &key)) {
            // Renew the entry's age for the pruning of a later run (failure only ages it).
            if let Some(f) = &file {
                let _ = std::fs::File::options()
                    .append(true)
                    .open(f)
                    .and_then(|h| h.set_modified(std::time::SystemTime::now()));
            }
            let img = Arc::new(img);
            let mut inner = self.lock();
            inner.stats.disk_hits += 1;
            self.ram_insert(&mut inner, key, img.clone());
            return Ok(img);
        }
        let img = Arc::new(make()?);
        let entry_bytes = (ENTRY_HEADER + key.len() + img.as_raw().len()) as u64;
        // The disk bytes are reserved under the lock and the file written outside it.
        let write = {
            let mut inner = self.lock();
            inner.stats.misses += 1;
            let fits = file.is_some() && inner.stats.disk_bytes + entry_bytes <= self.disk_bound;
            if fits {
                inner.stats.disk_bytes += entry_bytes;
            }
            file.filter(|_| fits)
        };
        let failed = write.is_some_and(|file| write_entry(&file, &key, &img).is_err());
        let mut inner = self.lock();
        if failed {
            inner.stats.disk_bytes -= entry_bytes;
            inner.stats.write_errors += 1;
        }
        self.ram_insert(&mut inner, key, img.clone());
        Ok(img)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A worker that panicked while holding the lock left counters, not broken pixels.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn ram_get(&self, key: &str) -> Option<Arc<RgbImage>> {
        let mut inner = self.lock();
        let img = inner.ram.get(key).cloned()?;
        inner.stats.ram_hits += 1;
        Some(img)
    }

    /// Keeps `img` in RAM, first dropping the oldest entries until it fits the bound.
    fn ram_insert(&self, inner: &mut Inner, key: String, img: Arc<RgbImage>) {
        let bytes = img.as_raw().len() as u64;
        if bytes > self.ram_bound || inner.ram.contains_key(&key) {
            return;
        }
        while inner.stats.ram_bytes + bytes > self.ram_bound {
            let Some(old) = inner.order.pop_front() else { break };
            if let Some(gone) = inner.ram.remove(&old) {
                inner.stats.ram_bytes -= gone.as_raw().len() as u64;
                inner.stats.ram_entries -= 1;
            }
        }
        inner.stats.ram_bytes += bytes;
        inner.stats.ram_entries += 1;
        inner.order.push_back(key.clone());
        inner.ram.insert(key, img);
    }
}

/// The folder of the disk tier: `configured` when set, else `$XDG_CACHE_HOME/vramfit/images`,
/// else `$HOME/.cache/vramfit/images`; `None` when none of them is known.
pub fn cache_dir(configured: &str) -> Option<PathBuf> {
    if !configured.is_empty() {
        return Some(PathBuf::from(configured));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("vramfit").join("images"))
}

/// The folder of the disk tier `data` configures, `None` when `data.cache_disk_mib` is 0 or no
/// folder is known ([`cache_dir`]).
pub fn disk_folder(data: &DataConfig) -> Option<PathBuf> {
    (data.cache_disk_mib > 0).then(|| cache_dir(&data.cache_dir)).flatten()
}

/// One line on the cache `data` configures: its bounds, folder and the folder's present size
/// (what `check-data` and the app's setup panel show). Only reads the folder: opening an
/// [`ImageCache`] would trim it.
pub fn summary(data: &DataConfig) -> String {
    if data.cache_ram_mib == 0 && data.cache_disk_mib == 0 {
        return "decoded-image cache off (data.cache_ram_mib and data.cache_disk_mib are 0)".into();
    }
    match disk_folder(data) {
        Some(dir) => format!(
            "decoded-image cache: {} MiB RAM; {:.1} of {} MiB on disk in {}",
            data.cache_ram_mib,
            folder_bytes(&dir) as f64 / f64::from(1 << 20),
            data.cache_disk_mib,
            dir.display()
        ),
        None => format!("decoded-image cache: {} MiB RAM, none on disk", data.cache_ram_mib),
    }
}

/// Whether the disk folder `dir` holds `path` under `geometry` (reads the entry's key only).
pub fn on_disk(dir: &Path, path: &Path, geometry: &str) -> bool {
    let Some(key) = entry_key(path, geometry) else { return false };
    let Ok(mut f) = std::fs::File::open(entry_file(dir, &key)) else { return false };
    let mut head = vec![0u8; MAGIC.len() + 4 + key.len()];
    std::io::Read::read_exact(&mut f, &mut head).is_ok()
        && head.starts_with(MAGIC)
        && head[MAGIC.len()..MAGIC.len() + 4] == (key.len() as u32).to_le_bytes()
        && head[MAGIC.len() + 4..] == *key.as_bytes()
}

/// Bytes of the regular files directly in `dir` (0 when it cannot be read).
fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
        })
        .unwrap_or(0)
}

/// Removes `dir`'s half-written entries, then its least recently modified entries until it
/// holds at most `keep_bytes`. Returns the bytes left (0 when the folder cannot be read).
fn prune(dir: &Path, keep_bytes: u64) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        if e.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            let _ = std::fs::remove_file(e.path());
            continue;
        }
        files.push((meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len(), e.path()));
    }
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    files.sort();
    for (_, len, path) in files {
        if total <= keep_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
    total
}

/// `path`'s cache key: absolute path, size, modification time (ns) and `geometry`.
fn entry_key(path: &Path, geometry: &str) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    let abs = std::path::absolute(path).ok()?;
    // `{:?}` escapes bytes that are not UTF-8, so two such paths never share a key.
    Some(format!("{abs:?}\n{}\n{mtime}\n{geometry}", meta.len()))
}

/// The disk entry of `key` in `dir`: named by the key's hash (the file holds the whole key).
fn entry_file(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{:016x}.rgb", fnv1a(key.as_bytes())))
}

/// A web build has no disk: the cache stays in memory there.
#[cfg(target_arch = "wasm32")]
fn write_entry(_file: &Path, _key: &str, _img: &RgbImage) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// 64-bit FNV-1a (the file name only; the key inside the file is what is checked).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Writes an entry (magic, key length, key, width, height, CRC-32 of the pixels, RGB pixels)
/// through a temporary file renamed into place, so a reader never sees half an entry. (A web
/// build has no disk: the cache stays in memory there.)
#[cfg(not(target_arch = "wasm32"))]
fn write_entry(file: &Path, key: &str, img: &RgbImage) -> std::io::Result<()> {
    use std::io::Write;
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(TMP_PREFIX).tempfile_in(dir)?;
    let mut header = Vec::with_capacity(ENTRY_HEADER + key.len());
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&(key.len() as u32).to_le_bytes());
    header.extend_from_slice(key.as_bytes());
    header.extend_from_slice(&img.width().to_le_bytes());
    header.extend_from_slice(&img.height().to_le_bytes());
    header.extend_from_slice(&crc32fast::hash(img.as_raw()).to_le_bytes());
    tmp.write_all(&header)?;
    tmp.write_all(img.as_raw())?;
    tmp.persist(file).map_err(|e| e.error)?;
    Ok(())
}

/// The image of an entry whose stored key is `key`; `None` for a missing, foreign, stale,
/// short, long or damaged file (the pixels' CRC-32 must match).
fn read_entry(file: &Path, key: &str) -> Option<RgbImage> {
    let mut bytes = std::fs::read(file).ok()?;
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let (stored, rest) = rest.split_at_checked(u32::from_le_bytes(*len) as usize)?;
    if stored != key.as_bytes() {
        return None;
    }
    let (w, rest) = rest.split_first_chunk::<4>()?;
    let (h, rest) = rest.split_first_chunk::<4>()?;
    let (crc, pixels) = rest.split_first_chunk::<4>()?;
    let (w, h) = (u32::from_le_bytes(*w), u32::from_le_bytes(*h));
    if pixels.len() as u64 != u64::from(w) * u64::from(h) * 3 || crc32fast::hash(pixels) != u32::from_le_bytes(*crc) {
        return None;
    }
    let offset = bytes.len() - pixels.len();
    RgbImage::from_raw(w, h, bytes.split_off(offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(seed: u8, w: u32, h: u32) -> RgbImage {
        RgbImage::from_fn(w, h, |x, y| image::Rgb([seed, x as u8, y as u8]))
    }

    fn never() -> Result<RgbImage, String> {
        Err("decoded again".into())
    }

    #[test]
    fn second_read_comes_from_ram_and_a_new_cache_reads_the_disk_entry() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.jpg");
        std::fs::write(&src, b"stand-in file").unwrap();
        let store = dir.path().join("cache");
        let cache = ImageCache::new(1 << 20, 1 << 20, Some(store.clone()));
        let first = cache.get_or_insert_with(&src, "g", || Ok::<_, String>(image(1, 5, 4))).unwrap();
        assert_eq!(*cache.get_or_insert_with(&src, "g", never).unwrap(), *first);
        let s = cache.stats();
        assert_eq!((s.misses, s.ram_hits, s.disk_hits, s.ram_bytes, s.ram_entries), (1, 1, 0, 60, 1));
        assert!(s.disk_bytes > 60, "{s:?}");
        // A later run: same folder, nothing in RAM.
        let later = ImageCache::new(1 << 20, 1 << 20, Some(store.clone()));
        assert_eq!(later.stats().disk_bytes, s.disk_bytes);
        assert!(on_disk(&store, &src, "g") && !on_disk(&store, &src, "other geometry"));
        assert_eq!(*later.get_or_insert_with(&src, "g", never).unwrap(), *first);
        assert_eq!(later.stats().disk_hits, 1);
    }

    #[test]
    fn a_changed_file_or_another_geometry_misses() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.png");
        std::fs::write(&src, b"version 1").unwrap();
        let cache = ImageCache::new(1 << 20, 1 << 20, Some(dir.path().join("cache")));
        cache.get_or_insert_with(&src, "load 256", || Ok::<_, String>(image(1, 3, 3))).unwrap();
        let other = cache.get_or_insert_with(&src, "load 128", || Ok::<_, String>(image(2, 3, 3))).unwrap();
        assert_eq!(other.get_pixel(0, 0).0[0], 2);
        std::fs::write(&src, b"version 2, longer").unwrap();
        let changed = cache.get_or_insert_with(&src, "load 256", || Ok::<_, String>(image(3, 3, 3))).unwrap();
        assert_eq!(changed.get_pixel(0, 0).0[0], 3, "a changed file is decoded again");
        assert_eq!(cache.stats().misses, 3);
    }

    #[test]
    fn ram_stays_within_its_bound_and_disk_stops_at_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        // 10 images of 300 bytes; RAM holds 3, disk about 4.
        let cache = ImageCache::new(900, 4 * 400, Some(dir.path().join("cache")));
        for i in 0..10u8 {
            let src = dir.path().join(format!("{i}.png"));
            std::fs::write(&src, [i]).unwrap();
            cache.get_or_insert_with(&src, "g", || Ok::<_, String>(image(i, 10, 10))).unwrap();
            let s = cache.stats();
            assert!(s.ram_bytes <= 900 && s.disk_bytes <= 1600, "{s:?}");
        }
        let s = cache.stats();
        assert_eq!((s.ram_entries, s.misses), (3, 10));
        assert!(s.disk_bytes > 2 * 300, "{s:?}");
        // The newest stay in RAM.
        let last = dir.path().join("9.png");
        cache.get_or_insert_with(&last, "g", never).unwrap();
        assert_eq!(cache.stats().ram_hits, 1);
    }

    /// Writes one entry, damages its file with `damage`, and returns the image a new cache on
    /// the same folder serves (a miss decodes `image(9, ..)`) and its disk hits.
    fn after_damage(damage: impl FnOnce(&mut Vec<u8>)) -> (RgbImage, u64) {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.png");
        std::fs::write(&src, b"x").unwrap();
        let store = dir.path().join("cache");
        ImageCache::new(0, 1 << 20, Some(store.clone()))
            .get_or_insert_with(&src, "g", || Ok::<_, String>(image(1, 4, 4)))
            .unwrap();
        let entry = std::fs::read_dir(&store).unwrap().next().unwrap().unwrap().path();
        let mut bytes = std::fs::read(&entry).unwrap();
        damage(&mut bytes);
        std::fs::write(&entry, &bytes).unwrap();
        let fresh = ImageCache::new(0, 1 << 20, Some(store));
        let img = fresh.get_or_insert_with(&src, "g", || Ok::<_, String>(image(9, 4, 4))).unwrap();
        ((*img).clone(), fresh.stats().disk_hits)
    }

    #[test]
    fn a_damaged_entry_is_a_miss_not_an_image() {
        let (img, hits) = after_damage(|_| {});
        assert_eq!((img.get_pixel(0, 0).0[0], hits), (1, 1), "an undamaged entry is read back");
        let (img, hits) = after_damage(|b| {
            b.pop();
        });
        assert_eq!((img.get_pixel(0, 0).0[0], hits), (9, 0), "a truncated entry is decoded again");
        let (img, hits) = after_damage(|b| b.push(0));
        assert_eq!((img.get_pixel(0, 0).0[0], hits), (9, 0), "an entry with trailing bytes is decoded again");
        let (img, hits) = after_damage(|b| {
            let i = b.len() - 5;
            b[i] ^= 0x40;
        });
        assert_eq!((img.get_pixel(0, 0).0[0], hits), (9, 0), "the CRC caught a flipped pixel byte");
    }

    #[test]
    fn opening_trims_the_folder_to_three_quarters_oldest_first_and_drops_half_written_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("cache");
        std::fs::create_dir_all(&store).unwrap();
        let day = std::time::Duration::from_secs(86_400);
        for i in 0..8u64 {
            let f = store.join(format!("{i}.rgb"));
            std::fs::write(&f, vec![0u8; 1000]).unwrap();
            let age = std::time::SystemTime::now() - day * (10 - i as u32);
            std::fs::File::options().append(true).open(&f).unwrap().set_modified(age).unwrap();
        }
        std::fs::write(store.join(format!("{TMP_PREFIX}killed")), vec![0u8; 500]).unwrap();
        // Bound 8000: keep 6000, so the two oldest go.
        let cache = ImageCache::new(0, 8000, Some(store.clone()));
        assert_eq!(cache.stats().disk_bytes, 6000);
        let mut left: Vec<String> =
            std::fs::read_dir(&store).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        left.sort();
        assert_eq!(left, ["2.rgb", "3.rgb", "4.rgb", "5.rgb", "6.rgb", "7.rgb"]);
    }

    #[test]
    fn an_unwritable_folder_counts_an_error_and_the_image_still_arrives() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.png");
        std::fs::write(&src, b"x").unwrap();
        // The cache "folder" is a file: nothing can be created in it.
        let blocker = dir.path().join("cache");
        std::fs::write(&blocker, b"not a folder").unwrap();
        let cache = ImageCache::new(1 << 20, 1 << 20, Some(blocker));
        let img = cache.get_or_insert_with(&src, "g", || Ok::<_, String>(image(4, 2, 2))).unwrap();
        assert_eq!(img.get_pixel(0, 0).0[0], 4);
        assert_eq!(cache.stats().write_errors, 1);
    }

    #[test]
    fn the_default_folder_follows_xdg_then_home() {
        assert_eq!(cache_dir("/data/c"), Some(PathBuf::from("/data/c")));
        let d = cache_dir("").expect("HOME is set in tests");
        assert!(d.ends_with("vramfit/images"), "{}", d.display());
    }
}
