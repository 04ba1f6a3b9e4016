//! Encoded image bytes to 8-bit RGB (`docs/VISION.md` §2.1 step 1): PNG, JPEG, WebP and GIF
//! (its first frame), with the decoded size bounded before anything is allocated for it.
//!
//! Conversion is Pillow's `convert("RGB")`: alpha is dropped (no compositing: a transparent
//! pixel keeps its stored colour), gray is repeated to three channels, palettes are looked
//! up. 16-bit images are scaled to 8 bits.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

use crate::{Rgb8, VisionError};

/// The formats decoded; anything else is refused by name.
pub const FORMATS: &str = "PNG, JPEG, WebP or GIF";

/// Decodes `bytes` to RGB, refusing an image of more than `max_pixels` pixels before its
/// pixels are decoded.
pub fn decode(bytes: &[u8], max_pixels: usize) -> Result<Rgb8, VisionError> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| VisionError::Corrupt {
            format: "image",
            message: e.to_string(),
        })?;
    let format = match reader.format() {
        Some(ImageFormat::Png) => "PNG",
        Some(ImageFormat::Jpeg) => "JPEG",
        Some(ImageFormat::WebP) => "WebP",
        Some(ImageFormat::Gif) => "GIF",
        Some(other) => {
            return Err(VisionError::UnsupportedFormat {
                format: format!("{other:?}"),
            })
        }
        None => return Err(VisionError::UnknownFormat),
    };
    let corrupt = |e: image::ImageError| VisionError::Corrupt {
        format,
        message: e.to_string(),
    };
    let mut reader = reader;
    // The decoders' own allocations (the output buffer and their scratch) are bounded too:
    // at most 8 bytes a pixel (16-bit RGBA), plus room for the decoders' tables.
    let mut limits = Limits::default();
    limits.max_alloc = Some(
        (max_pixels as u64)
            .saturating_mul(8)
            .saturating_add(64 << 20),
    );
    reader.limits(limits);
    let decoder = reader.into_decoder().map_err(corrupt)?;
    let (width, height) = decoder.dimensions();
    let (width, height) = (width as usize, height as usize);
    if width == 0 || height == 0 {
        return Err(VisionError::ZeroSize { width, height });
    }
    if width.saturating_mul(height) > max_pixels {
        return Err(VisionError::TooManyPixels {
            width,
            height,
            max: max_pixels,
        });
    }
    if format == "JPEG" {
        check_jpeg_ends(bytes)?;
    }
    let rgb = DynamicImage::from_decoder(decoder)
        .map_err(corrupt)?
        .into_rgb8();
    Ok(Rgb8 {
        width,
        height,
        data: rgb.into_raw(),
    })
}

/// Walks a JPEG's segments and entropy-coded scans to its end-of-image marker. The decoder
/// fills the rows of a file cut short with gray; Pillow (and so the reference processor)
/// refuses it as truncated, and so does spindle.
fn check_jpeg_ends(bytes: &[u8]) -> Result<(), VisionError> {
    let corrupt = |message: String| VisionError::Corrupt {
        format: "JPEG",
        message,
    };
    let truncated = || {
        corrupt(format!(
            "its {} bytes end before the end-of-image marker: truncated",
            bytes.len()
        ))
    };
    let mut at = 2; // after the start-of-image marker
    loop {
        if bytes.get(at) != Some(&0xff) {
            return Err(match at < bytes.len() {
                true => corrupt(format!("no segment marker at byte {at}")),
                false => truncated(),
            });
        }
        // Any number of 0xff fill bytes may precede a marker's code.
        while bytes.get(at) == Some(&0xff) {
            at += 1;
        }
        let Some(&code) = bytes.get(at) else {
            return Err(truncated());
        };
        at += 1;
        match code {
            0xd9 => return Ok(()),
            0x01 | 0xd0..=0xd8 => continue, // markers without a length
            _ => {}
        }
        let Some(len) = bytes.get(at..at + 2) else {
            return Err(truncated());
        };
        let len = u16::from_be_bytes([len[0], len[1]]) as usize;
        if len < 2 {
            return Err(corrupt(format!(
                "segment 0xff{code:02x} at byte {} has length {len}",
                at - 2
            )));
        }
        at += len;
        if code == 0xda {
            // A scan's entropy-coded data runs to the next marker other than a stuffed
            // 0xff00 or a restart marker.
            loop {
                let Some(ff) = bytes
                    .get(at..)
                    .and_then(|r| r.iter().position(|&b| b == 0xff))
                else {
                    return Err(truncated());
                };
                at += ff;
                match bytes.get(at + 1) {
                    None => return Err(truncated()),
                    Some(0x00 | 0xd0..=0xd7) => at += 2,
                    Some(_) => break,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageBuffer, Luma, Rgb, Rgba};

    fn encode(image: DynamicImage, format: ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        image.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    fn pattern(width: u32, height: u32) -> ImageBuffer<Rgb<u8>, Vec<u8>> {
        ImageBuffer::from_fn(width, height, |x, y| {
            Rgb([(x * 7 + y) as u8, (y * 13) as u8, (x ^ y) as u8])
        })
    }

    #[test]
    fn png_and_lossless_webp_decode_exactly() {
        let rgb = pattern(23, 17);
        for format in [ImageFormat::Png, ImageFormat::WebP] {
            let bytes = encode(DynamicImage::ImageRgb8(rgb.clone()), format);
            let out = decode(&bytes, 1 << 20).unwrap();
            assert_eq!((out.width, out.height), (23, 17), "{format:?}");
            assert_eq!(out.data, rgb.as_raw().clone(), "{format:?}");
        }
    }

    #[test]
    fn alpha_is_dropped_without_compositing() {
        // A fully transparent red pixel stays red (Pillow's convert("RGB")).
        let rgba = ImageBuffer::from_fn(4, 3, |x, _| Rgba([200, x as u8, 7, 0]));
        let bytes = encode(DynamicImage::ImageRgba8(rgba), ImageFormat::Png);
        let out = decode(&bytes, 1 << 20).unwrap();
        assert_eq!(&out.data[..6], &[200, 0, 7, 200, 1, 7]);
    }

    #[test]
    fn gray_is_repeated_to_three_channels() {
        let gray = ImageBuffer::from_fn(5, 2, |x, y| Luma([(10 * x + y) as u8]));
        let bytes = encode(DynamicImage::ImageLuma8(gray), ImageFormat::Png);
        let out = decode(&bytes, 1 << 20).unwrap();
        assert_eq!(&out.data[3..9], &[10, 10, 10, 20, 20, 20]);
    }

    #[test]
    fn palette_png_is_looked_up() {
        // An indexed PNG written by hand: 2x1, palette [red, blue], pixels 1, 0.
        let mut bytes = Vec::new();
        {
            let mut encoder = png::Encoder::new(&mut bytes, 2, 1);
            encoder.set_color(png::ColorType::Indexed);
            encoder.set_depth(png::BitDepth::Eight);
            encoder.set_palette(vec![255, 0, 0, 0, 0, 255]);
            let mut writer = encoder.write_header().unwrap();
            writer.write_image_data(&[1, 0]).unwrap();
        }
        let out = decode(&bytes, 1 << 20).unwrap();
        assert_eq!(out.data, vec![0, 0, 255, 255, 0, 0]);
    }

    #[test]
    fn a_jpeg_must_reach_its_end_of_image_marker() {
        let bytes = encode(DynamicImage::ImageRgb8(pattern(40, 24)), ImageFormat::Jpeg);
        assert_eq!(&bytes[bytes.len() - 2..], &[0xff, 0xd9]);
        let mut trailing = bytes.clone();
        trailing.extend(b"bytes after the image");
        assert_eq!(decode(&trailing, 1 << 20).unwrap().width, 40);
        for cut in [bytes.len() - 2, bytes.len() - 40] {
            let message = decode(&bytes[..cut], 1 << 20).unwrap_err().to_string();
            assert!(
                message.contains("JPEG") && message.contains("truncated"),
                "{message}"
            );
        }
    }

    #[test]
    fn gif_gives_its_first_frame() {
        use image::codecs::gif::GifEncoder;
        use image::{Delay, Frame};
        let frame = |v: u8| {
            Frame::from_parts(
                ImageBuffer::from_pixel(3, 2, Rgba([v, 0, 255 - v, 255])),
                0,
                0,
                Delay::from_numer_denom_ms(100, 1),
            )
        };
        let mut bytes = Vec::new();
        {
            let mut encoder = GifEncoder::new(&mut bytes);
            encoder.encode_frames([frame(255), frame(0)]).unwrap();
        }
        let out = decode(&bytes, 1 << 20).unwrap();
        assert_eq!((out.width, out.height), (3, 2));
        assert!(
            out.data.chunks(3).all(|p| p == [255, 0, 0]),
            "{:?}",
            out.data
        );
    }

    #[test]
    fn bad_input_is_refused_by_name() {
        assert_eq!(
            decode(b"hello, not an image", 1 << 20),
            Err(VisionError::UnknownFormat)
        );
        let mut png = encode(DynamicImage::ImageRgb8(pattern(8, 8)), ImageFormat::Png);
        png.truncate(png.len() / 2);
        assert!(matches!(
            decode(&png, 1 << 20),
            Err(VisionError::Corrupt { format: "PNG", .. })
        ));
        let bmp = encode(DynamicImage::ImageRgb8(pattern(2, 2)), ImageFormat::Png);
        let mut bmp_header = b"BM".to_vec();
        bmp_header.extend_from_slice(&bmp);
        assert!(matches!(
            decode(&bmp_header, 1 << 20),
            Err(VisionError::UnsupportedFormat { .. }) | Err(VisionError::UnknownFormat)
        ));
    }

    #[test]
    fn too_many_pixels_are_refused_from_the_header() {
        let bytes = encode(DynamicImage::ImageRgb8(pattern(40, 30)), ImageFormat::Png);
        assert_eq!(
            decode(&bytes, 1199),
            Err(VisionError::TooManyPixels {
                width: 40,
                height: 30,
                max: 1199
            })
        );
        assert!(decode(&bytes, 1200).is_ok());
    }
}
