//! `spindle run --image FILE`: image files read, prepared for the model's vision tower
//! (`spindle_vision::prepare_within`) and placed in the user message, before its text.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use spindle_vision::{ImageInput, Limits, PreparedImage};

/// The largest image file read (bytes); its decoded size is bounded separately.
pub const MAX_IMAGE_FILE_BYTES: u64 = 64 << 20;

/// The model's image input and each `--image` file prepared for it, in order. Refuses a
/// model without a vision tower, and images that together need more than `context` tokens.
pub fn load(
    paths: &[PathBuf],
    model_dir: &Path,
    context: usize,
) -> Result<(ImageInput, Vec<PreparedImage>)> {
    let input = ImageInput::from_model_dir(model_dir)
        .with_context(|| format!("reading the image input of {}", model_dir.display()))?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--image: {} has no vision tower (its config.json has no vision_config): \
                 it reads text only",
                model_dir.display()
            )
        })?;
    let mut images = Vec::with_capacity(paths.len());
    let mut tokens = 0usize;
    for path in paths {
        let bytes = read_bounded(path)?;
        let limits = Limits {
            max_tokens: context.saturating_sub(tokens),
            ..Limits::default()
        };
        let image = spindle_vision::prepare_within(&bytes, &input.geometry, &limits)
            .with_context(|| format!("--image {}", path.display()))?;
        tokens += image.tokens(input.geometry.merge);
        images.push(image);
    }
    Ok((input, images))
}

fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path).with_context(|| format!("--image {}", path.display()))?;
    anyhow::ensure!(
        meta.is_file(),
        "--image {}: not a regular file",
        path.display()
    );
    anyhow::ensure!(
        meta.len() <= MAX_IMAGE_FILE_BYTES,
        "--image {}: {} bytes, more than the {MAX_IMAGE_FILE_BYTES} an image file may have",
        path.display(),
        meta.len()
    );
    std::fs::read(path).with_context(|| format!("--image {}", path.display()))
}

/// A user message's content: `images` image items, then `text` (plain text without images).
pub fn user_content(text: &str, images: usize) -> Value {
    if images == 0 {
        return Value::String(text.to_owned());
    }
    let mut parts: Vec<Value> = (0..images).map(|_| json!({"type": "image"})).collect();
    parts.push(json!({"type": "text", "text": text}));
    Value::Array(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_come_before_the_text() {
        assert_eq!(user_content("hi", 0), json!("hi"));
        assert_eq!(
            user_content("what?", 2),
            json!([{"type": "image"}, {"type": "image"}, {"type": "text", "text": "what?"}])
        );
    }
}
