//! Files written atomically and durably: a reader (or a crash) sees the old file or the new one,
//! never half of one.

use std::path::Path;

use crate::engine::error::{Error, Result};

/// Writes `bytes` to `path` atomically and durably: a temporary file in the same folder, synced
/// (`fsync`), renamed over `path`, then the folder synced so the rename itself survives a power
/// cut. A crash leaves either the old file or the new one, and at worst a `.NAME.tmp` file that
/// [`crate::train::checkpoint::remove_temporaries`] deletes.
///
/// # Errors
/// [`Error::Io`] naming the path (a full disk fails here, before the old file is replaced).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::write(dir, &e))?;
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::write(&tmp, &e));
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::write(path, &e))?;
    sync_dir(dir)
}

/// Syncs a folder's entries (the names created or renamed in it) to disk. A no-op where folders
/// cannot be opened for syncing (Windows).
pub fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))?;
    let _ = dir;
    Ok(())
}
