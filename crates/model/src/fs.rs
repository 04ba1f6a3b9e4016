//! Bounded reads of the small files spindle parses (configs, indexes, manifests, tokenizers):
//! a regular file no larger than a stated cap, read without hanging on a FIFO or a device.
//!
//! The errors are `std::io::Error`s whose message names the cap or the kind of file found,
//! so any crate can wrap them with the path (`ModelError::Io` prints "cannot read PATH: …").

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Cap for a model's `config.json`, `generation_config.json` and similar JSON files.
pub const CONFIG_LIMIT: u64 = 16 << 20;
/// Cap for `model.safetensors.index.json` (a few MB for the largest checkpoints).
pub const INDEX_LIMIT: u64 = 64 << 20;
/// Cap for a file `spindle convert` copies verbatim (tokenizer.json, vocab.json, merges.txt).
pub const AUX_LIMIT: u64 = 256 << 20;
/// Cap for an install's `manifest.json` and its verification receipt.
pub const MANIFEST_LIMIT: u64 = 64 << 20;

/// What a non-regular file is, for messages.
fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// Refuses anything but a regular file (after following symlinks), naming what was found.
pub fn check_regular(meta: &Metadata) -> io::Result<()> {
    if meta.is_file() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}, expected a regular file", kind_of(meta)),
        ))
    }
}

fn too_large(size: u64, limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{size} bytes or more, over the {limit}-byte limit for this file"),
    )
}

/// Opens `path` for reading only if it is a regular file: the open is non-blocking (a FIFO
/// swapped in after the check cannot hang it) and the opened file is checked again.
pub fn open_regular(path: &Path) -> io::Result<File> {
    check_regular(&std::fs::metadata(path)?)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    check_regular(&file.metadata()?)?;
    Ok(file)
}

/// The bytes of the regular file `path`, refused when it holds more than `limit` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let size = file.metadata()?.len();
    if size > limit {
        return Err(too_large(size, limit));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // One byte past the limit tells a file that grew after the check.
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64, limit));
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_bounded_to_string(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_bounded(path, limit)?).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not UTF-8 text: {}", e.utf8_error()),
        )
    })
}

/// Checks `out`, a path a command is about to create or replace (`--out`, a convert's
/// destination): it must not exist or be a regular file (never a symlink, directory, FIFO,
/// socket or device, which a rename would replace), its directory must exist, and it must not
/// lie inside any of `protected` (the model directories being read). With `dir_output` the
/// path is a directory to be created and must not exist at all.
pub fn check_output(out: &Path, protected: &[&Path], dir_output: bool) -> io::Result<()> {
    let refuse = |message: String| Err(io::Error::new(io::ErrorKind::InvalidInput, message));
    let Some(name) = out.file_name() else {
        return refuse("expected a path ending in a file name".into());
    };
    match std::fs::symlink_metadata(out) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return refuse("is a symlink; give the path of a regular file (or a new one)".into())
        }
        Ok(meta) if dir_output || !meta.is_file() => {
            return refuse(format!(
                "already exists and is {}; give a new path",
                if meta.is_file() {
                    "a file"
                } else {
                    kind_of(&meta)
                }
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let real = parent
        .canonicalize()
        .map_err(|e| io::Error::new(e.kind(), format!("directory {}: {e}", parent.display())))?
        .join(name);
    for dir in protected {
        let Ok(dir) = dir.canonicalize() else {
            continue;
        };
        if real.starts_with(&dir) {
            return refuse(format!(
                "lies inside the model directory {} being read; write it elsewhere",
                dir.display()
            ));
        }
    }
    Ok(())
}

/// Writes `bytes` to a new file beside `path` and renames it over `path`: whatever `path` was
/// (a symlink included) is replaced, never written through.
pub fn write_replacing(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_and_non_regular_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, b"{\"a\": 1}").unwrap();
        assert_eq!(read_bounded_to_string(&path, 8).unwrap(), "{\"a\": 1}");
        let err = read_bounded(&path, 7).unwrap_err().to_string();
        assert!(err.contains("7-byte limit"), "{err}");

        let err = read_bounded(dir.path(), 1 << 20).unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");
        let err = read_bounded(Path::new("/dev/zero"), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(err.contains("character device"), "{err}");

        // A FIFO with no writer would block a plain open forever.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read_bounded(&fifo, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("a FIFO"), "{err}");
    }

    #[test]
    fn outputs_replace_only_regular_files_outside_the_model() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        std::fs::create_dir(&model).unwrap();
        let file = dir.path().join("out.safetensors");
        check_output(&file, &[&model], false).unwrap();
        std::fs::write(&file, b"old").unwrap();
        check_output(&file, &[&model], false).unwrap();
        assert!(check_output(&file, &[&model], true).is_err());

        let err = |p: &Path| check_output(p, &[&model], false).unwrap_err().to_string();
        assert!(err(&model.join("model.safetensors")).contains("inside the model directory"));
        assert!(err(&model.join("../model/x")).contains("inside the model directory"));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(err(&link).contains("symlink"));
        // A symlinked directory leading into the model is seen through.
        let into = dir.path().join("into");
        std::os::unix::fs::symlink(&model, &into).unwrap();
        assert!(err(&into.join("weights")).contains("inside the model directory"));
        assert!(err(Path::new("/dev/null")).contains("character device"));
        assert!(err(&model).contains("a directory"));
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(err(&fifo).contains("a FIFO"));
        assert!(err(&dir.path().join("missing/out")).contains("missing"));
    }
}
