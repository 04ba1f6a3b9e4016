//! Normalise and cut an already resized image into patch rows (`docs/VISION.md` §2.2-2.3).

use crate::{Geometry, Grid, PreparedImage, VisionError};

/// An 8-bit RGB image, rows top to bottom, `[height, width, 3]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rgb8 {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// Normalises `image` ((u8/255 - mean)/std per channel) and lays it out as the tower's patch
/// rows: the single frame repeated to `temporal` frames, rows 2x2-block-major, columns
/// (channel, frame, py, px). Both sides must already be multiples of `geometry.factor()`.
pub fn patchify(image: &Rgb8, geometry: &Geometry) -> Result<PreparedImage, VisionError> {
    let (width, height) = (image.width, image.height);
    let want = width * height * 3;
    if image.data.len() != want {
        return Err(VisionError::BufferSize {
            width,
            height,
            got: image.data.len(),
            want,
        });
    }
    let factor = geometry.factor();
    if width == 0 || height == 0 || width % factor != 0 || height % factor != 0 {
        return Err(VisionError::NotAligned {
            width,
            height,
            factor,
        });
    }
    let (p, m, frames, channels) = (
        geometry.patch,
        geometry.merge,
        geometry.temporal,
        geometry.channels,
    );
    let grid = Grid {
        t: 1,
        h: height / p,
        w: width / p,
    };
    let row_len = geometry.row_len();
    let mut pixels = vec![0f32; grid.patches() * row_len];
    let mut rows = pixels.chunks_exact_mut(row_len);
    for bh in 0..grid.h / m {
        for bw in 0..grid.w / m {
            for ih in 0..m {
                for iw in 0..m {
                    let row = rows.next().expect("one row per patch");
                    let (r, c) = (bh * m + ih, bw * m + iw);
                    let mut cols = row.iter_mut();
                    for ch in 0..channels {
                        let scale = 1.0 / (255.0 * geometry.std[ch] as f64);
                        let shift = geometry.mean[ch] as f64 / geometry.std[ch] as f64;
                        for _ in 0..frames {
                            for py in 0..p {
                                for px in 0..p {
                                    let (y, x) = (r * p + py, c * p + px);
                                    let v = image.data[(y * width + x) * 3 + ch] as f64;
                                    *cols.next().expect("row_len columns") =
                                        (v * scale - shift) as f32;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(PreparedImage {
        pixels,
        row_len,
        grid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_block_major_and_columns_channel_frame_y_x() {
        let geometry = Geometry {
            patch: 1,
            temporal: 2,
            merge: 2,
            ..Geometry::default()
        };
        // 2x4 image: pixel (y, x) has red = 10y + x, green 100, blue 200.
        let mut data = Vec::new();
        for y in 0..2u8 {
            for x in 0..4u8 {
                data.extend_from_slice(&[10 * y + x, 100, 200]);
            }
        }
        let image = Rgb8 {
            width: 4,
            height: 2,
            data,
        };
        let prepared = patchify(&image, &geometry).unwrap();
        assert_eq!(prepared.grid, Grid { t: 1, h: 2, w: 4 });
        assert_eq!(prepared.row_len, 6);
        let red = |v: u8| (v as f32 / 255.0 - 0.5) / 0.5;
        // Block (0,0) holds (0,0) (0,1) (1,0) (1,1), then block (0,1): (0,2) (0,3) (1,2) (1,3).
        let order = [0u8, 1, 10, 11, 2, 3, 12, 13];
        for (row, &v) in prepared.pixels.chunks(6).zip(&order) {
            assert!((row[0] - red(v)).abs() < 1e-6 && (row[1] - red(v)).abs() < 1e-6);
            assert!((row[2] - red(100)).abs() < 1e-6 && (row[4] - red(200)).abs() < 1e-6);
        }
    }

    #[test]
    fn misaligned_sides_are_refused() {
        let image = Rgb8 {
            width: 40,
            height: 32,
            data: vec![0; 40 * 32 * 3],
        };
        assert_eq!(
            patchify(&image, &Geometry::default()),
            Err(VisionError::NotAligned {
                width: 40,
                height: 32,
                factor: 32
            })
        );
    }
}
