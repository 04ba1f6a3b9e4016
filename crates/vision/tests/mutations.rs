//! Images damaged and forged: the fixture JPEG and PNG cut at many lengths and with random
//! bytes replaced, headers that claim huge or zero sizes (with valid checksums), and bytes
//! that are no image at all. Each is refused with a message about the image, never a panic,
//! never an allocation beyond the decoded-pixel bound (`spindle_testkit::mutate`).

use spindle_testkit::mutate::{self, flips, run_cases, truncations, Case, XorShift};
use spindle_vision::{prepare, Geometry};

#[global_allocator]
static ALLOC: mutate::Bounded = mutate::Bounded;

fn fixture(name: &str) -> Vec<u8> {
    let path = spindle_testkit::fixtures()
        .join("vision_preprocess")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// `png` with its IHDR width and height replaced and the chunk's CRC recomputed.
fn png_claiming(png: &[u8], width: u32, height: u32) -> Vec<u8> {
    let mut out = png.to_vec();
    // Signature (8), IHDR length (4), "IHDR" (4), width, height, 5 more bytes, CRC.
    out[16..20].copy_from_slice(&width.to_be_bytes());
    out[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = crc32(&out[12..29]);
    out[29..33].copy_from_slice(&crc.to_be_bytes());
    out
}

/// `jpeg` with its baseline frame header's height and width replaced.
fn jpeg_claiming(jpeg: &[u8], width: u16, height: u16) -> Vec<u8> {
    let sof = jpeg
        .windows(2)
        .position(|w| w == [0xff, 0xc0])
        .expect("a baseline JPEG");
    let mut out = jpeg.to_vec();
    // FFC0, length (2), precision (1), height (2), width (2).
    out[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    out[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    out
}

/// A GIF whose logical screen and one frame claim `width` x `height`, with one byte of data.
fn gif_claiming(width: u16, height: u16) -> Vec<u8> {
    let mut out = b"GIF89a".to_vec();
    out.extend(width.to_le_bytes());
    out.extend(height.to_le_bytes());
    out.extend([0x80, 0, 0]); // a 2-entry global palette
    out.extend([0, 0, 0, 255, 255, 255]);
    out.push(0x2c); // image descriptor
    out.extend([0, 0, 0, 0]);
    out.extend(width.to_le_bytes());
    out.extend(height.to_le_bytes());
    out.push(0);
    out.extend([2, 2, 0x4c, 0x01, 0]); // LZW min code size 2, one 2-byte block
    out.push(0x3b);
    out
}

/// A WebP (VP8X extended header) whose canvas claims `width` x `height` and holds nothing.
fn webp_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut chunk = b"VP8X".to_vec();
    chunk.extend(10u32.to_le_bytes());
    chunk.extend([0, 0, 0, 0]);
    chunk.extend(&(width - 1).to_le_bytes()[..3]);
    chunk.extend(&(height - 1).to_le_bytes()[..3]);
    let mut out = b"RIFF".to_vec();
    out.extend((4 + chunk.len() as u32).to_le_bytes());
    out.extend(b"WEBP");
    out.extend(chunk);
    out
}

#[test]
fn damaged_and_forged_images_are_refused() {
    let jpeg = fixture("photo.jpg");
    let png = fixture("rgba.png");
    let mut rng = XorShift(0x5eed_0000_0000_0003);
    let mut cases = Vec::new();
    // A PNG cut inside its closing IEND chunk (the last 12 bytes) has lost no pixels.
    for (label, bytes, keep) in [("JPEG", &jpeg, 0), ("PNG", &png, 12)] {
        cases.extend(truncations(label, bytes, 0..bytes.len() - keep, 50));
        cases.extend(flips(label, bytes, 0..bytes.len().min(2048), 60, &mut rng));
        cases.extend(flips(label, bytes, 0..bytes.len(), 30, &mut rng));
    }
    for (w, h) in [(0, 75), (100, 0), (1 << 16, 1 << 16), (u32::MAX, u32::MAX)] {
        cases.push(Case::refused(
            format!("PNG claiming {w}x{h}"),
            png_claiming(&png, w, h),
        ));
    }
    for (w, h) in [(0, 96), (65535, 65535), (65535, 1)] {
        cases.push(Case::refused(
            format!("JPEG claiming {w}x{h}"),
            jpeg_claiming(&jpeg, w, h),
        ));
    }
    for (w, h) in [(0, 1), (65535, 65535), (65535, 1)] {
        cases.push(Case::refused(
            format!("GIF claiming {w}x{h}"),
            gif_claiming(w, h),
        ));
    }
    for (w, h) in [(1 << 24, 1 << 24), (16384, 16384), (1, 1)] {
        cases.push(Case::refused(
            format!("WebP claiming {w}x{h}"),
            webp_claiming(w, h),
        ));
    }
    for (label, bytes) in [
        ("empty", Vec::new()),
        ("text", b"hello, not an image".to_vec()),
        ("PNG signature alone", png[..8].to_vec()),
        ("GIF89a alone", b"GIF89a".to_vec()),
        (
            "a BMP header",
            b"BM\x36\x00\x00\x00\x00\x00\x00\x00\x36\x00\x00\x00".to_vec(),
        ),
        ("a TIFF header", b"II*\x00\x08\x00\x00\x00".to_vec()),
        (
            "JSON",
            br#"{"image": "data:image/png;base64,AAAA"}"#.to_vec(),
        ),
    ] {
        cases.push(Case::refused(label, bytes));
    }
    let geometry = Geometry::default();
    run_cases("images", cases, &["image"], |bytes| {
        prepare(bytes, &geometry)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
}
