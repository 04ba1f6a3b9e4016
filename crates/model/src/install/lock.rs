//! The exclusive lock a convert holds on its destination: `DST.lock` beside `DST`, locked with
//! `flock` (through `File::try_lock`), so two converts into one destination never interleave
//! (the second is refused at once, naming the destination) and never report a mixed install.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::error::{InstallError, Result};

/// Held while a convert writes; removes the lock file when dropped.
pub struct DestinationLock {
    path: PathBuf,
    // Keeps the flock; closed after the file is unlinked (see `Drop`).
    _file: File,
}

impl DestinationLock {
    /// Locks `dst` (whose file name is `name`), or refuses when another convert holds it.
    pub fn acquire(dst: &Path, name: &str) -> Result<Self> {
        let path = dst.with_file_name(format!("{name}.lock"));
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(InstallError::io(&path))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Err(InstallError::Locked {
                        path: dst.to_owned(),
                        lock: path,
                    })
                }
                Err(TryLockError::Error(e)) => return Err(InstallError::io(&path)(e)),
            }
            // The holder before us may have unlinked the file between our open and our lock:
            // the lock only counts while `path` is still the file we locked.
            let held = file.metadata().map_err(InstallError::io(&path))?;
            match std::fs::metadata(&path) {
                Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => {
                    return Ok(DestinationLock { path, _file: file })
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(InstallError::io(&path)(e)),
            }
        }
    }
}

impl Drop for DestinationLock {
    fn drop(&mut self) {
        // Unlinked while still locked, so a waiting convert re-checks and starts afresh.
        let _ = std::fs::remove_file(&self.path);
    }
}
