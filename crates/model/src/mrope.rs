//! Positions of a prompt with images (shared docs `VISION.md` §4): image features replace the
//! `<|image_pad|>` embeddings, and the full-attention layers rotate by 3-D (T, H, W) positions
//! where an image advances the counter by max(h', w'), not by its token count. Backend-neutral:
//! the engines keep a [`RopeCursor`] per sequence and ask it for each token's position.

use std::sync::Arc;

/// One image's merged features, ready to replace its pads: `rows` is `[tokens, hidden]`, one row
/// per LLM token in raster order over the merged grid `frames x height x width`.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageFeatures {
    pub rows: Vec<f32>,
    pub hidden: usize,
    /// Frames (1 for an image).
    pub frames: usize,
    /// h' = grid h / merge: merged rows.
    pub height: usize,
    /// w' = grid w / merge: merged columns.
    pub width: usize,
}

impl ImageFeatures {
    /// The merger's output `rows` (`[tokens, hidden]`) for an image of patch grid `grid`,
    /// merged `merge` x `merge`.
    pub fn merged(rows: Vec<f32>, hidden: usize, grid: spindle_vision::Grid, merge: usize) -> Self {
        ImageFeatures {
            rows,
            hidden,
            frames: grid.t,
            height: grid.h / merge,
            width: grid.w / merge,
        }
    }

    /// How many `<|image_pad|>` tokens the image takes.
    pub fn tokens(&self) -> usize {
        self.frames * self.height * self.width
    }

    /// The feature row of token `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.rows[i * self.hidden..(i + 1) * self.hidden]
    }

    /// (T, H, W) of token `i` of this image when the image starts at position `base`
    /// (`get_vision_position_ids`: T = base + frame, H = base + row, W = base + column).
    pub fn position(&self, base: usize, i: usize) -> [usize; 3] {
        let plane = self.height * self.width;
        let (frame, rest) = (i / plane, i % plane);
        [
            base + frame,
            base + rest / self.width,
            base + rest % self.width,
        ]
    }

    /// How far the image moves the position counter: max(h', w') (§4.2).
    pub fn advance(&self) -> usize {
        self.height.max(self.width)
    }
}

/// An image of a sequence whose pads have not all been fed yet.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingImage {
    pub features: Arc<ImageFeatures>,
    /// Pads already fed (replaced by rows `0..placed`).
    pub placed: usize,
    /// The position the image started at (valid once `placed > 0`).
    pub base: usize,
}

impl PendingImage {
    pub fn new(features: Arc<ImageFeatures>) -> Self {
        PendingImage {
            features,
            placed: 0,
            base: 0,
        }
    }
}

/// What a token of a sequence is, for the embedding and the rotary position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenRole {
    /// An ordinary token: its own embedding, position (p, p, p).
    Text,
    /// Row `row` of image `image` (index into the pending queue at the start of the call).
    Image { image: usize, row: usize },
}

/// A sequence's rotary positions (§4.2, §4.4): `delta` (rope_delta) is what the rotary
/// position of a text token adds to its cache index, and `pending` the images whose pads are
/// still to come, in order. A text-only sequence has delta 0 and nothing pending, so its rotary
/// position is its cache index as before.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RopeCursor {
    pub delta: i64,
    pub pending: std::collections::VecDeque<PendingImage>,
    /// Images whose first pad has been fed: a sequence's state depends on them from then on.
    pub images_started: usize,
}

/// Why a sequence's tokens could not be placed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("an image's pads stop after {placed} of its {tokens} tokens and token {token} (id {id}) follows: an image's <|image_pad|> tokens must be consecutive")]
    Interrupted {
        placed: usize,
        tokens: usize,
        token: usize,
        id: u32,
    },
}

impl RopeCursor {
    /// Queues `features` in order: the next `<|image_pad|>` tokens take their rows. Refuses
    /// (queueing nothing) features whose width is not the model's `hidden` size.
    pub fn queue_images(
        &mut self,
        features: &[Arc<ImageFeatures>],
        hidden: usize,
    ) -> Result<(), String> {
        if let Some(bad) = features.iter().find(|f| f.hidden != hidden) {
            return Err(format!(
                "image features of width {} for a model of hidden size {hidden}",
                bad.hidden
            ));
        }
        self.pending
            .extend(features.iter().cloned().map(PendingImage::new));
        Ok(())
    }

    /// Whether the next tokens are all text, at their cache index + `delta`.
    pub fn is_text_only(&self) -> bool {
        self.pending.is_empty()
    }

    /// The rotary position of a text token at cache index `position`.
    pub fn text_position(&self, position: usize) -> usize {
        (position as i64 + self.delta) as usize
    }

    /// Places `ids`, the sequence's tokens from cache index `position` on: each `image_token`
    /// while an image is pending takes that image's next row, every other token is text.
    /// Returns each token's role and (T, H, W) position and advances the cursor; on an error
    /// the cursor is unchanged. An `image_token` with no image pending is text (as
    /// transformers treats a generated pad).
    pub fn place(
        &mut self,
        ids: &[u32],
        position: usize,
        image_token: u32,
    ) -> Result<(Vec<TokenRole>, Vec<[usize; 3]>), PlacementError> {
        let mut delta = self.delta;
        let mut started = self.images_started;
        let mut image = 0;
        let (mut placed, mut base) = self.pending.front().map_or((0, 0), |p| (p.placed, p.base));
        let mut roles = Vec::with_capacity(ids.len());
        let mut positions = Vec::with_capacity(ids.len());
        for (token, &id) in ids.iter().enumerate() {
            let here = (position + token) as i64 + delta;
            match self.pending.get(image) {
                Some(p) if id == image_token => {
                    let features = &p.features;
                    if placed == 0 {
                        base = here as usize;
                        started += 1;
                    }
                    roles.push(TokenRole::Image { image, row: placed });
                    positions.push(features.position(base, placed));
                    placed += 1;
                    if placed == features.tokens() {
                        // The next token continues at base + max(h', w').
                        delta = (base + features.advance()) as i64 - (position + token + 1) as i64;
                        image += 1;
                        placed = 0;
                    }
                }
                Some(p) if placed > 0 => {
                    return Err(PlacementError::Interrupted {
                        placed,
                        tokens: p.features.tokens(),
                        token,
                        id,
                    })
                }
                _ => {
                    roles.push(TokenRole::Text);
                    positions.push([here as usize; 3]);
                }
            }
        }
        self.delta = delta;
        self.images_started = started;
        self.pending.drain(..image);
        if let Some(front) = self.pending.front_mut() {
            front.placed = placed;
            front.base = base;
        }
        Ok((roles, positions))
    }
}

/// `get_rope_index` for one prompt (§4.2): every token's (T, H, W) position and rope_delta
/// (max position + 1 − length), with `images` in the order of their pads.
pub fn rope_index(
    ids: &[u32],
    image_token: u32,
    images: &[Arc<ImageFeatures>],
) -> Result<(Vec<[usize; 3]>, i64), PlacementError> {
    let mut cursor = RopeCursor {
        pending: images.iter().cloned().map(PendingImage::new).collect(),
        ..RopeCursor::default()
    };
    let (_, positions) = cursor.place(ids, 0, image_token)?;
    Ok((positions, cursor.delta))
}

/// The interleaved mRoPE slot map (§4.3): which position row (0 = T, 1 = H, 2 = W) frequency
/// slot `j` rotates by, for `section` = `mrope_section` ([11, 11, 10] released).
pub fn mrope_row(j: usize, section: &[usize]) -> usize {
    if j % 3 == 1 && j < 3 * section[1] {
        1
    } else if j % 3 == 2 && j < 3 * section[2] {
        2
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(height: usize, width: usize) -> Arc<ImageFeatures> {
        Arc::new(ImageFeatures {
            rows: vec![0.0; height * width],
            hidden: 1,
            frames: 1,
            height,
            width,
        })
    }

    #[test]
    fn images_of_another_width_are_refused_and_none_queued() {
        let mut cursor = RopeCursor::default();
        let wide = Arc::new(ImageFeatures {
            hidden: 2,
            ..(*image(1, 1)).clone()
        });
        let err = cursor.queue_images(&[image(2, 2), wide], 1).unwrap_err();
        assert!(
            err.contains("width 2") && err.contains("hidden size 1"),
            "{err}"
        );
        assert!(cursor.pending.is_empty());
        cursor.queue_images(&[image(2, 2), image(1, 3)], 1).unwrap();
        assert_eq!(cursor.pending.len(), 2);
        assert!(!cursor.is_text_only());
    }

    #[test]
    fn worked_example_of_the_docs() {
        // 5 text, <vs>, a 3x5 merged image (15 pads), <ve>, 4 text (VISION.md §4.2).
        let mut ids = vec![10u32; 6];
        ids.extend([5; 15]);
        ids.extend([11; 5]);
        let (pos, delta) = rope_index(&ids, 5, &[image(3, 5)]).unwrap();
        assert_eq!(pos[5], [5; 3]);
        assert_eq!(pos[6], [6, 6, 6]);
        assert_eq!(pos[6 + 7], [6, 7, 8]);
        assert_eq!(pos[20], [6, 8, 10]);
        assert_eq!(pos[21], [11; 3]);
        assert_eq!(pos[25], [15; 3]);
        assert_eq!(delta, -10);
    }

    #[test]
    fn placing_in_pieces_equals_placing_at_once() {
        let mut ids = vec![1u32, 2, 5, 5, 5, 5, 5, 5, 3, 5, 5, 5, 5, 4];
        ids.extend([7, 8]);
        let images = [image(2, 3), image(2, 2)];
        let (whole, delta) = rope_index(&ids, 5, &images).unwrap();
        for cut in 0..ids.len() {
            let mut cursor = RopeCursor {
                pending: images.iter().cloned().map(PendingImage::new).collect(),
                ..RopeCursor::default()
            };
            let (_, mut a) = cursor.place(&ids[..cut], 0, 5).unwrap();
            let (_, b) = cursor.place(&ids[cut..], cut, 5).unwrap();
            a.extend(b);
            assert_eq!(a, whole, "cut at {cut}");
            assert_eq!(cursor.delta, delta);
            assert!(cursor.pending.is_empty());
        }
    }

    #[test]
    fn text_inside_an_image_is_refused_and_leaves_the_cursor() {
        let mut cursor = RopeCursor::default();
        cursor.pending.push_back(PendingImage::new(image(2, 2)));
        let before = cursor.clone();
        let err = cursor.place(&[1, 5, 5, 9, 5, 5], 0, 5).unwrap_err();
        assert!(matches!(
            err,
            PlacementError::Interrupted {
                placed: 2,
                token: 3,
                ..
            }
        ));
        assert_eq!(cursor, before);
    }

    #[test]
    fn a_pad_without_a_pending_image_is_text() {
        let mut cursor = RopeCursor::default();
        let (roles, pos) = cursor.place(&[5, 6], 4, 5).unwrap();
        assert_eq!(roles, vec![TokenRole::Text; 2]);
        assert_eq!(pos, vec![[4; 3], [5; 3]]);
    }

    #[test]
    fn slot_map_is_interleaved() {
        let section = [11, 11, 10];
        let rows: Vec<usize> = (0..32).map(|j| mrope_row(j, &section)).collect();
        assert_eq!(&rows[..6], &[0, 1, 2, 0, 1, 2]);
        assert_eq!(rows[29], 2);
        assert_eq!(rows[30], 0);
        assert_eq!(rows[31], 1);
        assert_eq!(rows.iter().filter(|&&r| r == 1).count(), 11);
        assert_eq!(rows.iter().filter(|&&r| r == 2).count(), 10);
    }
}
