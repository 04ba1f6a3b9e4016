//! The processor's `replace_image_token` (`docs/VISION.md` §5): the chat template writes one
//! `<|image_pad|>` per image; the k-th becomes as many pads as the k-th image has tokens.

use thiserror::Error;

use crate::PreparedImage;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PadError {
    #[error("the prompt has {pads} image placeholders (<|image_pad|>) but {images} images were given: each image needs its own placeholder and each placeholder an image")]
    Count { pads: usize, images: usize },
}

/// `ids` with the k-th `image_pad_id` repeated `images[k].tokens(merge)` times. A pad without
/// an image, or an image without a pad, is refused: both counts are named.
pub fn expand_image_pads(
    ids: &[u32],
    image_pad_id: u32,
    images: &[PreparedImage],
    merge: usize,
) -> Result<Vec<u32>, PadError> {
    let pads = ids.iter().filter(|&&id| id == image_pad_id).count();
    if pads != images.len() {
        return Err(PadError::Count {
            pads,
            images: images.len(),
        });
    }
    let extra: usize = images
        .iter()
        .map(|i| i.tokens(merge).saturating_sub(1))
        .sum();
    let mut out = Vec::with_capacity(ids.len() + extra);
    let mut next = images.iter().peekable();
    for &id in ids {
        match next.next_if(|_| id == image_pad_id) {
            Some(image) => out.extend(std::iter::repeat_n(id, image.tokens(merge))),
            None => out.push(id),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Grid;

    fn image(h: usize, w: usize) -> PreparedImage {
        PreparedImage {
            pixels: Vec::new(),
            row_len: 1536,
            grid: Grid { t: 1, h, w },
        }
    }

    #[test]
    fn each_pad_becomes_its_images_token_count_in_order() {
        // Pad id 5 between vision_start 3 and vision_end 4; grids 6x10 (15 tokens), 4x4 (4).
        let ids = [9, 3, 5, 4, 8, 3, 5, 4, 7];
        let out = expand_image_pads(&ids, 5, &[image(6, 10), image(4, 4)], 2).unwrap();
        let mut want = vec![9, 3];
        want.extend([5; 15]);
        want.extend([4, 8, 3]);
        want.extend([5; 4]);
        want.extend([4, 7]);
        assert_eq!(out, want);
    }

    #[test]
    fn pads_and_images_must_pair_up() {
        assert_eq!(
            expand_image_pads(&[1, 5, 2], 5, &[], 2),
            Err(PadError::Count { pads: 1, images: 0 })
        );
        assert_eq!(
            expand_image_pads(&[1, 2], 5, &[image(4, 4)], 2),
            Err(PadError::Count { pads: 0, images: 1 })
        );
        assert_eq!(expand_image_pads(&[1, 2], 5, &[], 2).unwrap(), vec![1, 2]);
    }
}
