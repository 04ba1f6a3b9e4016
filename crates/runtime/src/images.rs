//! Prompts with images (shared docs `VISION.md` §4-5): token ids whose `<|image_pad|>` runs
//! take the features of the images given with them, in order. The pads are checked against the
//! images once, before anything runs: a prompt whose pads have no image, images without pads
//! or counts that differ is refused by name.

use spindle_model::ModelConfig;
use spindle_vision::PreparedImage;

use crate::error::{Result, RuntimeError};

/// Token ids to continue, and the images their `<|image_pad|>` tokens stand for (in order of
/// their pads; each image takes `grid.tokens(merge)` consecutive pads).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenPrompt {
    pub ids: Vec<u32>,
    pub images: Vec<PreparedImage>,
}

impl TokenPrompt {
    pub fn new(ids: Vec<u32>, images: Vec<PreparedImage>) -> Self {
        TokenPrompt { ids, images }
    }

    /// The index of the first `<|image_pad|>` of a prompt with images: state past it depends
    /// on the images, not only on the ids, so a prefix cache keyed by ids stops there.
    pub fn first_image_pad(&self, config: &ModelConfig) -> Option<usize> {
        if self.images.is_empty() {
            return None;
        }
        let pad = config.vision.as_ref()?.tokens.image;
        self.ids.iter().position(|&id| id == pad)
    }
}

impl From<Vec<u32>> for TokenPrompt {
    fn from(ids: Vec<u32>) -> Self {
        TokenPrompt {
            ids,
            images: Vec::new(),
        }
    }
}

/// Checks that `ids`' `<|image_pad|>` tokens match `images`: image k takes the next
/// `tokens_k` pads, which must be consecutive, and every pad belongs to an image. A model
/// without `vision_config` takes no images (its ids are not checked: it has no pad token).
pub fn check_image_pads(config: &ModelConfig, ids: &[u32], images: &[PreparedImage]) -> Result<()> {
    let refuse = |message: String| Err(RuntimeError::Image(message));
    let Some(vision) = &config.vision else {
        if images.is_empty() {
            return Ok(());
        }
        return refuse(format!(
            "{} image(s) were given but this model takes no images (config.json has no vision_config)",
            images.len()
        ));
    };
    let pad = vision.tokens.image;
    if pad as usize >= config.vocab_size && images.is_empty() {
        // The pad cannot occur in a valid prompt (and image input is off for such a model).
        return Ok(());
    }
    let merge = vision.merge;
    let wanted: Vec<usize> = images.iter().map(|i| i.tokens(merge)).collect();
    let total: usize = wanted.iter().sum();
    let pads = ids.iter().filter(|&&id| id == pad).count();
    if pads == 0 && images.is_empty() {
        return Ok(());
    }
    if images.is_empty() {
        return refuse(format!(
            "the prompt holds {pads} <|image_pad|> token(s) (id {pad}) but no image was given: \
             image pads come from images in the request"
        ));
    }
    if pads != total {
        let each: Vec<String> = wanted
            .iter()
            .enumerate()
            .map(|(k, n)| format!("image {k}: {n}"))
            .collect();
        return refuse(format!(
            "the prompt holds {pads} <|image_pad|> token(s) (id {pad}) but the {} image(s) take {total} ({})",
            images.len(),
            each.join(", ")
        ));
    }
    // Each image's pads are consecutive.
    let mut at = 0;
    for (k, &n) in wanted.iter().enumerate() {
        let start = at
            + ids[at..]
                .iter()
                .position(|&id| id == pad)
                .expect("counted above");
        if let Some(gap) = ids[start..start + n].iter().position(|&id| id != pad) {
            return refuse(format!(
                "image {k} takes {n} consecutive <|image_pad|> tokens from position {start}, but \
                 position {} holds token {}",
                start + gap,
                ids[start + gap]
            ));
        }
        at = start + n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_vision::Grid;

    fn config() -> ModelConfig {
        let text = include_str!("../../../fixtures/qwen3_5_dense_vision/config.json");
        ModelConfig::from_json_str(text, std::path::Path::new("config.json")).unwrap()
    }

    /// An image of `h` x `w` merged tokens (pixels left empty: only the grid is read).
    fn image(h: usize, w: usize) -> PreparedImage {
        PreparedImage {
            pixels: Vec::new(),
            row_len: 1536,
            grid: Grid {
                t: 1,
                h: 2 * h,
                w: 2 * w,
            },
        }
    }

    #[test]
    fn matching_pads_pass() {
        let config = config();
        let ids = [1, 3, 5, 5, 5, 5, 4, 3, 5, 5, 4, 9];
        check_image_pads(&config, &ids, &[image(2, 2), image(1, 2)]).unwrap();
        // Two images back to back: 6 consecutive pads.
        check_image_pads(&config, &[5; 6], &[image(2, 2), image(1, 2)]).unwrap();
        check_image_pads(&config, &[1, 2, 3], &[]).unwrap();
    }

    #[test]
    fn mismatches_are_refused_by_name() {
        let config = config();
        let message = |ids: &[u32], images: &[PreparedImage]| {
            check_image_pads(&config, ids, images)
                .unwrap_err()
                .to_string()
        };
        let m = message(&[1, 5, 5, 2], &[]);
        assert!(
            m.contains("2 <|image_pad|>") && m.contains("no image was given"),
            "{m}"
        );
        let m = message(&[1, 2], &[image(1, 1)]);
        assert!(
            m.contains("0 <|image_pad|>") && m.contains("image 0: 1"),
            "{m}"
        );
        let m = message(&[5, 5, 5], &[image(2, 2)]);
        assert!(m.contains("3 <|image_pad|>") && m.contains("take 4"), "{m}");
        let m = message(&[5, 5, 7, 5, 5], &[image(2, 2)]);
        assert!(
            m.contains("image 0 takes 4 consecutive") && m.contains("position 2"),
            "{m}"
        );
    }

    #[test]
    fn a_model_without_vision_refuses_images() {
        // The demo without its tower (it has one since synth writes it).
        let dir = crate::demo_dir().unwrap();
        let mut config = ModelConfig::from_dir(&dir).unwrap();
        assert!(config.vision.is_some(), "the demo takes images");
        config.vision = None;
        check_image_pads(&config, &[1, 2], &[]).unwrap();
        let m = check_image_pads(&config, &[1, 2], &[image(1, 1)])
            .unwrap_err()
            .to_string();
        assert!(m.contains("no vision_config"), "{m}");
    }
}
