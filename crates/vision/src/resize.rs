//! The target size (`smart_resize`, `docs/VISION.md` §2.1) and the bicubic resize to it.
//!
//! The resize follows torchvision's `resize(uint8, BICUBIC, antialias=True)` on the CPU, which
//! is what transformers' `Qwen2VLImageProcessor` runs: ATen's separable uint8 kernel (ported
//! from Pillow-SIMD). Per axis, the Keys cubic with a = -0.5 is sampled around each output
//! pixel's centre, stretched by the scale when downscaling (the antialias), the weights are
//! normalised in f64 and rounded to i16 at the axis's own fixed-point precision, and the sums
//! are rounded and clamped to u8: first along rows (horizontal), then along columns. An axis
//! whose size does not change is not touched.

use crate::{Rgb8, VisionError};

/// transformers' `smart_resize(height, width, factor, min_pixels, max_pixels)` (5.17.0): the
/// `(height, width)` the image is resized to, both multiples of `factor`, keeping the aspect
/// ratio and the pixel count within `[min_pixels, max_pixels]`. Float64 throughout, with
/// Python's `round` (half to even): 336 px gives 320, not 352.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize), VisionError> {
    if height == 0 || width == 0 {
        return Err(VisionError::ZeroSize { width, height });
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let aspect = h.max(w) / h.min(w);
    if aspect > MAX_ASPECT_RATIO {
        return Err(VisionError::AspectRatio {
            width,
            height,
            ratio: aspect,
        });
    }
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    Ok((h_bar as usize, w_bar as usize))
}

/// `smart_resize` refuses images whose longer side is more than this many times the shorter.
pub const MAX_ASPECT_RATIO: f64 = 200.0;

/// Resizes `image` to `width` x `height` with torchvision's antialiased bicubic on uint8
/// (see the module doc). Returns the image itself when the size already fits.
pub fn resize_bicubic(image: Rgb8, width: usize, height: usize) -> Result<Rgb8, VisionError> {
    if width == 0 || height == 0 || image.width == 0 || image.height == 0 {
        return Err(VisionError::ZeroSize { width, height });
    }
    let mut image = image;
    if width != image.width {
        let taps = AxisTaps::new(image.width, width);
        image = resample_rows(&image, &taps);
    }
    if height != image.height {
        let taps = AxisTaps::new(image.height, height);
        image = resample_columns(&image, &taps);
    }
    Ok(image)
}

/// Keys' cubic convolution kernel with a = -0.5 (ATen's `HelperInterpCubic::aa_filter`, written
/// as ATen writes it so the f64 roundings agree).
fn cubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

/// For each output index along one axis: the first input index, the weights (i16 fixed point
/// with `precision` fractional bits) of the inputs from there on.
struct AxisTaps {
    start: Vec<usize>,
    /// `[out, max_taps]`, zero past each output's own taps.
    weights: Vec<i32>,
    counts: Vec<usize>,
    max_taps: usize,
    precision: u32,
}

impl AxisTaps {
    /// ATen's `_compute_indices_int16_weights_aa` with `align_corners = false`, no scale
    /// factor (scale = in / out) and antialias on.
    fn new(input: usize, output: usize) -> Self {
        let scale = input as f64 / output as f64;
        // Cubic interp_size is 4: support 2, stretched by the scale when downscaling.
        let (support, inv_scale) = if scale >= 1.0 {
            (2.0 * scale, 1.0 / scale)
        } else {
            (2.0, 1.0)
        };
        let max_taps = support.ceil() as usize * 2 + 1;
        let mut start = Vec::with_capacity(output);
        let mut counts = Vec::with_capacity(output);
        let mut real = vec![0f64; output * max_taps];
        for (i, row) in real.chunks_exact_mut(max_taps).enumerate() {
            let center = scale * (i as f64 + 0.5);
            let lo = ((center - support + 0.5) as i64).max(0) as usize;
            let hi = ((center + support + 0.5) as i64).min(input as i64) as usize;
            let count = hi.saturating_sub(lo);
            let mut total = 0.0;
            for (j, w) in row[..count].iter_mut().enumerate() {
                *w = cubic(((j + lo) as f64 - center + 0.5) * inv_scale);
                total += *w;
            }
            if total != 0.0 {
                for w in &mut row[..count] {
                    *w /= total;
                }
            }
            start.push(lo);
            counts.push(count);
        }
        let w_max = real.iter().copied().fold(real[0], f64::max);
        let mut precision = 0u32;
        while precision < 22 {
            let next = (0.5 + w_max * (1u64 << (precision + 1)) as f64) as i64;
            if next >= 1 << 15 {
                break;
            }
            precision += 1;
        }
        let unit = (1u64 << precision) as f64;
        let weights = real
            .iter()
            .map(|&v| {
                // C's `(int)` truncation after adding ±0.5: rounds half away from zero.
                if v < 0.0 {
                    (-0.5 + v * unit) as i16 as i32
                } else {
                    (0.5 + v * unit) as i16 as i32
                }
            })
            .collect();
        AxisTaps {
            start,
            weights,
            counts,
            max_taps,
            precision,
        }
    }

    /// The fixed-point sum `sum(pixel(k) * w_k)` for output `i`, rounded and clamped to u8.
    fn apply(&self, i: usize, pixel: impl Fn(usize) -> u8) -> u8 {
        let weights = &self.weights[i * self.max_taps..][..self.counts[i]];
        let mut sum: i64 = 1 << (self.precision - 1);
        for (k, &w) in weights.iter().enumerate() {
            sum += pixel(self.start[i] + k) as i64 * w as i64;
        }
        (sum >> self.precision).clamp(0, 255) as u8
    }
}

/// Resamples every row of `image` to `taps`' output width.
fn resample_rows(image: &Rgb8, taps: &AxisTaps) -> Rgb8 {
    let out_width = taps.start.len();
    let mut data = vec![0u8; image.height * out_width * 3];
    for (y, out_row) in data.chunks_exact_mut(out_width * 3).enumerate() {
        let row = &image.data[y * image.width * 3..][..image.width * 3];
        for x in 0..out_width {
            for c in 0..3 {
                out_row[x * 3 + c] = taps.apply(x, |k| row[k * 3 + c]);
            }
        }
    }
    Rgb8 {
        width: out_width,
        height: image.height,
        data,
    }
}

/// Resamples every column of `image` to `taps`' output height.
fn resample_columns(image: &Rgb8, taps: &AxisTaps) -> Rgb8 {
    let out_height = taps.start.len();
    let stride = image.width * 3;
    let mut data = vec![0u8; out_height * stride];
    for (y, out_row) in data.chunks_exact_mut(stride).enumerate() {
        for (i, out) in out_row.iter_mut().enumerate() {
            *out = taps.apply(y, |k| image.data[k * stride + i]);
        }
    }
    Rgb8 {
        width: image.width,
        height: out_height,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn constant(width: usize, height: usize, rgb: [u8; 3]) -> Rgb8 {
        Rgb8 {
            width,
            height,
            data: rgb.repeat(width * height),
        }
    }

    #[test]
    fn the_kernel_is_keys_with_a_minus_half() {
        // Interpolating: 1 at 0, 0 at the other integers; a = -0.5 gives -1/16 at 1.5.
        assert_eq!(cubic(0.0), 1.0);
        assert_eq!(cubic(1.0), 0.0);
        assert_eq!(cubic(2.0), 0.0);
        assert_eq!(cubic(1.5), -0.0625);
        assert_eq!(cubic(0.5), 0.5625);
        assert_eq!(cubic(-0.5), cubic(0.5));
    }

    #[test]
    fn a_size_that_fits_is_returned_unchanged() {
        let data: Vec<u8> = (0..64 * 32 * 3).map(|i| (i * 37 % 251) as u8).collect();
        let image = Rgb8 {
            width: 64,
            height: 32,
            data,
        };
        assert_eq!(resize_bicubic(image.clone(), 64, 32).unwrap(), image);
    }

    #[test]
    fn a_constant_image_stays_constant_up_and_down() {
        for (w, h) in [(96, 64), (17, 9), (320, 256)] {
            let out = resize_bicubic(constant(50, 70, [200, 3, 128]), w, h).unwrap();
            assert_eq!((out.width, out.height), (w, h));
            assert!(out.data.chunks(3).all(|p| p == [200, 3, 128]), "{w}x{h}");
        }
    }

    #[test]
    fn halving_a_stripe_pattern_matches_the_hand_computed_filter() {
        // Columns alternate 0, 255 (8 wide, 1 high), halved to 4: scale 2, support 4, the
        // kernel stretched x2. Output 1 (centre 3.0) takes inputs 0..=6 at distances
        // (k - 2.5) / 2 = -1.25, -0.75, -0.25, 0.25, 0.75, 1.25, 1.75. cubic(0.25) = 0.8671875,
        // cubic(0.75) = 0.2265625, cubic(1.25) = -0.0703125, cubic(1.75) = -0.0234375; the 255s
        // at odd k weigh 0.2265625 + 0.8671875 - 0.0703125 = 1.0234375 of a total 2.0234375:
        // 255 * 1.0234375 / 2.0234375 = 128.98 -> 129. Output 0 (centre 1.0) takes 0..=4 at
        // -0.25, 0.25, 0.75, 1.25, 1.75 (clipped at the edge, renormalised): the 255s weigh
        // 0.8671875 - 0.0703125 of 1.8671875, 255 * 0.796875 / 1.8671875 = 108.83 -> 109.
        let data: Vec<u8> = (0..8)
            .flat_map(|x| [if x % 2 == 1 { 255 } else { 0 }; 3])
            .collect();
        let image = Rgb8 {
            width: 8,
            height: 1,
            data,
        };
        let out = resize_bicubic(image, 4, 1).unwrap();
        assert_eq!(out.data[3], 129);
        assert_eq!(out.data[0], 109);
    }

    #[test]
    fn smart_resize_refuses_extreme_aspect_ratios_and_empty_images() {
        assert!(matches!(
            smart_resize(32, 6500, 32, 65_536, 16_777_216),
            Err(VisionError::AspectRatio { ratio, .. }) if ratio == 203.125
        ));
        assert!(matches!(
            smart_resize(0, 10, 32, 65_536, 16_777_216),
            Err(VisionError::ZeroSize { .. })
        ));
    }
}
