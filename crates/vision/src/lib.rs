//! Image input for the Qwen3.5/3.6 vision tower (`docs/VISION.md` §2 of the shared docs): an
//! image becomes [`PreparedImage`]: patch rows in the tower's order plus its patch grid.
//!
//! [`prepare`] is the whole path, as transformers' processor runs it: decode ([`decode`]),
//! convert to RGB, `smart_resize` ([`smart_resize`]), bicubic resize ([`resize_bicubic`]),
//! normalise and patchify ([`patchify`]). [`expand_image_pads`] then gives each image its
//! `<|image_pad|>` tokens in the prompt.
//!
//! The tower, its weights and the 3-D positions live with the model and the backends; this
//! crate only knows pixels and the geometry they are cut by.

mod config;
mod decode;
mod pads;
mod patchify;
mod resize;
mod tables;

pub use config::ImageInput;
pub use decode::{decode, FORMATS};
pub use pads::{expand_image_pads, PadError};
pub use patchify::{patchify, Rgb8};
pub use resize::{resize_bicubic, smart_resize, MAX_ASPECT_RATIO};
pub use tables::{interpolation, patch_coords, rope_tables};

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum VisionError {
    #[error("the image is not PNG, JPEG, WebP or GIF (its first bytes match no known format)")]
    UnknownFormat,
    #[error("{format} images are not supported: send PNG, JPEG, WebP or GIF")]
    UnsupportedFormat { format: String },
    #[error("the {format} image could not be decoded: {message}")]
    Corrupt {
        format: &'static str,
        message: String,
    },
    #[error("the image is {width}x{height} pixels: it has no pixels")]
    ZeroSize { width: usize, height: usize },
    #[error("the image is {width}x{height} = {} pixels, more than the {max} decoded pixels an image may have", width * height)]
    TooManyPixels {
        width: usize,
        height: usize,
        max: usize,
    },
    #[error("the image is {width}x{height}: its aspect ratio {ratio} is above {}, which the processor refuses (absolute aspect ratio must be smaller than 200)", MAX_ASPECT_RATIO)]
    AspectRatio {
        width: usize,
        height: usize,
        ratio: f64,
    },
    #[error("the image is {width}x{height} and becomes {tokens} image tokens, more than the {max} allowed")]
    TooManyTokens {
        width: usize,
        height: usize,
        tokens: usize,
        max: usize,
    },
    #[error("{field}: {message}")]
    Config { field: String, message: String },
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

/// Bounds on one image, checked before the work they bound is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Decoded pixels (width x height), checked from the header before decoding.
    pub max_decoded_pixels: usize,
    /// `<|image_pad|>` tokens the image may become, checked after `smart_resize` and before
    /// resizing (a context's worth is the natural bound).
    pub max_tokens: usize,
}

/// 64 Mpx (e.g. 9000 x 7000): larger photos are refused rather than decoded. RGBA at this
/// size is 256 MiB; `smart_resize` brings anything above 16.7 Mpx down anyway.
pub const MAX_DECODED_PIXELS: usize = 64 << 20;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_decoded_pixels: MAX_DECODED_PIXELS,
            max_tokens: usize::MAX,
        }
    }
}

/// An encoded image (PNG, JPEG, WebP, GIF) to the tower's input, as transformers'
/// `Qwen2VLImageProcessor` makes it: decode, RGB, `smart_resize`, bicubic resize, normalise,
/// patchify. Bounded by [`Limits::default`].
pub fn prepare(bytes: &[u8], geometry: &Geometry) -> Result<PreparedImage, VisionError> {
    prepare_within(bytes, geometry, &Limits::default())
}

/// [`prepare`] within `limits`.
pub fn prepare_within(
    bytes: &[u8],
    geometry: &Geometry,
    limits: &Limits,
) -> Result<PreparedImage, VisionError> {
    let image = decode(bytes, limits.max_decoded_pixels)?;
    prepare_rgb(image, geometry, limits)
}

/// The part of [`prepare_within`] after decoding.
pub fn prepare_rgb(
    image: Rgb8,
    geometry: &Geometry,
    limits: &Limits,
) -> Result<PreparedImage, VisionError> {
    let (width, height) = (image.width, image.height);
    let (h_bar, w_bar) = smart_resize(
        height,
        width,
        geometry.factor(),
        geometry.min_pixels,
        geometry.max_pixels,
    )?;
    let tokens =
        (h_bar / geometry.patch) * (w_bar / geometry.patch) / (geometry.merge * geometry.merge);
    if tokens > limits.max_tokens {
        return Err(VisionError::TooManyTokens {
            width,
            height,
            tokens,
            max: limits.max_tokens,
        });
    }
    let resized = resize_bicubic(image, w_bar, h_bar)?;
    patchify(&resized, geometry)
}
