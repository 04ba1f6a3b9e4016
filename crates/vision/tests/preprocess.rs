//! The preprocessing path against transformers 5.17.0 (`fixtures/qwen3_5_dense_vision`:
//! `pixel_values`, `resize_cases.json`) and torchvision 0.26 / Pillow 12.3
//! (`fixtures/vision_preprocess`, made by `tools/vision/make_*_reference.py`).

use std::io::Cursor;

use image::{DynamicImage, ImageFormat, RgbImage};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use spindle_vision::{
    decode, prepare, resize_bicubic, smart_resize, Geometry, Grid, ImageInput, Rgb8, VisionError,
};

fn preprocess_fixture(name: &str) -> Vec<u8> {
    let path = spindle_testkit::fixtures()
        .join("vision_preprocess")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The bytes of a 31-bit LCG, as `make_resize_reference.py` makes its inputs.
fn lcg_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = (state * 1_103_515_245 + 12_345) % (1 << 31);
            ((state >> 16) & 255) as u8
        })
        .collect()
}

fn png(image: &Rgb8) -> Vec<u8> {
    let buffer =
        RgbImage::from_raw(image.width as u32, image.height as u32, image.data.clone()).unwrap();
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(buffer)
        .write_to(&mut out, ImageFormat::Png)
        .unwrap();
    out.into_inner()
}

#[test]
fn smart_resize_reproduces_every_transformers_case() {
    let path = spindle_testkit::fixture("qwen3_5_dense_vision").join("resize_cases.json");
    let cases = json(&path);
    let cases = cases.as_array().expect("a list of cases");
    assert!(cases.len() >= 12, "{} cases", cases.len());
    for case in cases {
        let n = |k: &str| case[k].as_u64().unwrap() as usize;
        let got = smart_resize(
            n("height"),
            n("width"),
            n("factor"),
            n("min_pixels"),
            n("max_pixels"),
        );
        match &case["result"] {
            Value::Array(hw) => {
                let want = (
                    hw[0].as_u64().unwrap() as usize,
                    hw[1].as_u64().unwrap() as usize,
                );
                assert_eq!(got, Ok(want), "{case}");
            }
            Value::String(error) => {
                assert!(error.contains("aspect ratio"), "{error}");
                match got {
                    Err(VisionError::AspectRatio { ratio, .. }) => {
                        assert!(
                            error.ends_with(&format!("got {ratio}")),
                            "{error} vs {ratio}"
                        )
                    }
                    other => panic!("{case}: {other:?}"),
                }
            }
            other => panic!("unexpected result {other}"),
        }
    }
}

#[test]
fn fixture_images_as_png_give_the_reference_pixel_values() {
    // The fixture's processor bounds are 4096..262144 pixels (its preprocessor_config.json),
    // so smart_resize keeps 96x160 and 64x64 and no resampling is involved.
    let dir = spindle_testkit::fixture("qwen3_5_dense_vision");
    let geometry = ImageInput::from_model_dir(&dir).unwrap().unwrap().geometry;
    assert_eq!((geometry.min_pixels, geometry.max_pixels), (4096, 262_144));
    let path = dir.join("reference.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let want = st.tensor("pixel_values").unwrap();
    assert_eq!(want.shape(), [76, 1536]);
    let want: Vec<f32> = want
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let grids = st.tensor("image_grid_thw").unwrap();
    let grids: Vec<i64> = grids
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let mut rows = Vec::new();
    for k in 0..2 {
        let view = st.tensor(&format!("image_{k}")).unwrap();
        assert_eq!(view.dtype(), Dtype::U8);
        let (h, w) = (view.shape()[0], view.shape()[1]);
        let image = Rgb8 {
            width: w,
            height: h,
            data: view.data().to_vec(),
        };
        let prepared = prepare(&png(&image), &geometry).unwrap();
        let g = &grids[k * 3..k * 3 + 3];
        assert_eq!(
            prepared.grid,
            Grid {
                t: g[0] as usize,
                h: g[1] as usize,
                w: g[2] as usize
            }
        );
        rows.extend(prepared.pixels);
    }
    assert_eq!(rows.len(), want.len());
    let diff = rows
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff <= 1e-6, "max |diff| {diff}");
}

#[test]
fn bicubic_resize_equals_torchvision_on_every_reference_case() {
    let meta = json(
        &spindle_testkit::fixtures()
            .join("vision_preprocess")
            .join("resize_cases.json"),
    );
    let cases = meta["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let dim = |k: &str, i: usize| case[k][i].as_u64().unwrap() as usize;
        let (h, w, ho, wo) = (dim("in", 0), dim("in", 1), dim("out", 0), dim("out", 1));
        let image = Rgb8 {
            width: w,
            height: h,
            data: lcg_bytes(case["seed"].as_u64().unwrap(), h * w * 3),
        };
        let got = resize_bicubic(image, wo, ho).unwrap();
        let want = preprocess_fixture(&format!("{name}.u8"));
        assert_eq!(got.data.len(), want.len(), "{name}");
        let differing = got.data.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(
            differing,
            0,
            "{name}: {differing} of {} values differ",
            want.len()
        );
    }
}

#[test]
fn an_rgba_png_goes_through_like_the_transformers_processor() {
    // 75x100 RGBA, alpha random: alpha dropped, smart_resize to 224x320 (grid 14x20),
    // upscaled bicubic: transformers' resized image recovered from its pixel_values.
    let bytes = preprocess_fixture("rgba.png");
    let rgb = decode(&bytes, 1 << 20).unwrap();
    assert_eq!((rgb.width, rgb.height), (100, 75));
    let rgba = lcg_bytes(7, 75 * 100 * 4);
    let dropped: Vec<u8> = rgba.chunks(4).flat_map(|p| [p[0], p[1], p[2]]).collect();
    assert_eq!(
        rgb.data, dropped,
        "decoded RGB is the RGBA without its alpha"
    );
    let prepared = prepare(&bytes, &Geometry::default()).unwrap();
    assert_eq!(prepared.grid, Grid { t: 1, h: 14, w: 20 });
    let resized = resize_bicubic(rgb, 320, 224).unwrap();
    assert_eq!(resized.data, preprocess_fixture("rgba.resized.u8"));
    // And the first patch row: pixel (0, 0..16) of channel 0 frame 0 is columns 0..16.
    let row0: Vec<f32> = resized.data[..16 * 3]
        .chunks(3)
        .map(|p| (p[0] as f32 / 255.0 - 0.5) / 0.5)
        .collect();
    for (a, b) in prepared.pixels[..16].iter().zip(&row0) {
        assert!((a - b).abs() < 1e-6);
    }
}

#[test]
fn jpeg_decodes_within_a_step_or_two_of_pillow() {
    // zune-jpeg and Pillow's libjpeg-turbo differ in IDCT and chroma upsampling rounding.
    let ours = decode(&preprocess_fixture("photo.jpg"), 1 << 20).unwrap();
    let pillow = preprocess_fixture("photo.pil.u8");
    assert_eq!((ours.width, ours.height), (96, 64));
    let diffs: Vec<u8> = ours
        .data
        .iter()
        .zip(&pillow)
        .map(|(a, b)| a.abs_diff(*b))
        .collect();
    let max = *diffs.iter().max().unwrap();
    let mean = diffs.iter().map(|&d| d as f64).sum::<f64>() / diffs.len() as f64;
    eprintln!("JPEG vs Pillow: max |diff| {max}, mean {mean:.3}");
    assert!(max <= 3 && mean < 0.5, "max {max}, mean {mean}");
}

#[test]
fn images_that_become_too_many_tokens_are_refused_before_resizing() {
    let image = Rgb8 {
        width: 640,
        height: 640,
        data: vec![9; 640 * 640 * 3],
    };
    let limits = spindle_vision::Limits {
        max_tokens: 399,
        ..Default::default()
    };
    // 640x640 -> grid 40x40 -> 400 tokens.
    assert_eq!(
        spindle_vision::prepare_rgb(image, &Geometry::default(), &limits),
        Err(VisionError::TooManyTokens {
            width: 640,
            height: 640,
            tokens: 400,
            max: 399
        })
    );
}
