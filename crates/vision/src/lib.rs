//! Image input for the Qwen3.5/3.6 vision tower (`docs/VISION.md` §2 of the shared docs): an
//! image becomes [`PreparedImage`]: patch rows in the tower's order plus its patch grid.
//!
//! The tower, its weights and the 3-D positions live with the model and the backends; this
//! crate only knows pixels and the geometry they are cut by.

mod patchify;

pub use patchify::{patchify, Rgb8};

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum VisionError {
    #[error("image is {width}x{height} pixels: both sides must be multiples of {factor} to patchify (resize it first)")]
    NotAligned {
        width: usize,
        height: usize,
        factor: usize,
    },
    #[error("image buffer holds {got} bytes, {width}x{height} RGB needs {want}")]
    BufferSize {
        width: usize,
        height: usize,
        got: usize,
        want: usize,
    },
}

/// How images are cut for the tower: `vision_config`'s `patch_size`, `temporal_patch_size`,
/// `spatial_merge_size`, `in_channels`, and the preprocessor's pixel bounds and normalisation.
#[derive(Clone, Debug, PartialEq)]
pub struct Geometry {
    pub patch: usize,
    pub temporal: usize,
    pub merge: usize,
    pub channels: usize,
    /// `preprocessor_config.json` `size.shortest_edge`: a pixel count, not an edge.
    pub min_pixels: usize,
    /// `size.longest_edge`: a pixel count.
    pub max_pixels: usize,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Default for Geometry {
    /// The released Qwen3.5/3.6 values.
    fn default() -> Self {
        Geometry {
            patch: 16,
            temporal: 2,
            merge: 2,
            channels: 3,
            min_pixels: 65_536,
            max_pixels: 16_777_216,
            mean: [0.5; 3],
            std: [0.5; 3],
        }
    }
}

impl Geometry {
    /// Width of one patch row: channels x temporal x patch x patch (1536 released).
    pub fn row_len(&self) -> usize {
        self.channels * self.temporal * self.patch * self.patch
    }

    /// Image sides must be multiples of this (patch x merge; 32 released).
    pub fn factor(&self) -> usize {
        self.patch * self.merge
    }
}

/// An image's patch grid `(t, h, w)` in patches, before merging (`image_grid_thw`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub t: usize,
    pub h: usize,
    pub w: usize,
}

impl Grid {
    pub fn patches(&self) -> usize {
        self.t * self.h * self.w
    }

    /// How many `<|image_pad|>` tokens (LLM embeddings) the image becomes: t·h·w / merge².
    pub fn tokens(&self, merge: usize) -> usize {
        self.patches() / (merge * merge)
    }
}

/// One image ready for the tower: `pixels` is `[grid.patches(), row_len]` row-major, rows in
/// 2x2-block-major order and columns (channel, frame, py, px), as transformers' processor
/// returns `pixel_values`.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedImage {
    pub pixels: Vec<f32>,
    pub row_len: usize,
    pub grid: Grid,
}

impl PreparedImage {
    pub fn tokens(&self, merge: usize) -> usize {
        self.grid.tokens(merge)
    }
}
