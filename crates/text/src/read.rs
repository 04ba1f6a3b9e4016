//! Bounded reads of the files this crate parses: a size cap named in the error, and only
//! regular files (a FIFO or a device such as `/dev/zero` is refused before it is opened, so
//! neither hangs nor fills memory).

use std::io::Read;
use std::path::Path;

use crate::TextError;

/// `tokenizer.json`: the Qwen tokenizers are 11-20 MB.
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;
/// `tokenizer_config.json`, `chat_template.json`: a few hundred KB in real checkpoints.
pub const MAX_TOKENIZER_CONFIG_BYTES: u64 = 64 << 20;
/// `chat_template.jinja`: real templates are 5-20 KB.
pub const MAX_TEMPLATE_BYTES: u64 = 4 << 20;

/// Reads a regular file of at most `max_bytes`. Anything else (a directory, a FIFO, a
/// device, a larger file, one that grows past the cap while read) is refused by name.
pub fn read_bounded(path: &Path, max_bytes: u64) -> Result<Vec<u8>, TextError> {
    let io = |source| TextError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(TextError::invalid_file(
            path,
            "not a regular file (FIFOs, devices and directories are refused)",
        ));
    }
    let too_large = |size: u64| TextError::FileTooLarge {
        path: path.to_path_buf(),
        size,
        max_bytes,
    };
    if meta.len() > max_bytes {
        return Err(too_large(meta.len()));
    }
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_bounded_text(path: &Path, max_bytes: u64) -> Result<String, TextError> {
    String::from_utf8(read_bounded(path, max_bytes)?)
        .map_err(|e| TextError::invalid_file(path, format!("not UTF-8 text: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_directories_are_refused_without_reading() {
        let err = read_bounded(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let err = read_bounded(Path::new("/"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn a_file_over_the_cap_is_refused_naming_the_cap() {
        let path = std::env::temp_dir().join(format!("spindle-read-cap-{}", std::process::id()));
        std::fs::write(&path, vec![b'x'; 2048]).unwrap();
        let err = read_bounded(&path, 1024).unwrap_err();
        let _ = std::fs::remove_file(&path);
        let message = err.to_string();
        assert!(
            message.contains("2048") && message.contains("1024"),
            "{message}"
        );
    }
}
