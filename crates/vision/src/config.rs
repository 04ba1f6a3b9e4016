//! What a checkpoint says about its image input (`docs/VISION.md` §1.1-1.3): `config.json`'s
//! `vision_config` and token ids, and `preprocessor_config.json` when it is there.

use std::path::Path;

use serde_json::Value;

use crate::{Geometry, VisionError};

/// A checkpoint's image input: how images are cut, and the placeholder token the chat template
/// writes for each image.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageInput {
    pub geometry: Geometry,
    /// `image_token_id`: `<|image_pad|>`, repeated once per image token.
    pub image_token_id: u32,
}

/// The largest `preprocessor_config.json` read (a real one is < 1 KB).
const MAX_PREPROCESSOR_BYTES: u64 = 1 << 20;

impl ImageInput {
    /// Reads `dir/config.json` and, when present, `dir/preprocessor_config.json`. `None` for a
    /// checkpoint without `vision_config` (text only).
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>, VisionError> {
        let read = |name: &str| -> Result<Option<Value>, VisionError> {
            let path = dir.join(name);
            let bad = |message: String| VisionError::Config {
                field: path.display().to_string(),
                message,
            };
            match std::fs::metadata(&path) {
                Err(_) => return Ok(None),
                Ok(m) if !m.is_file() || m.len() > MAX_PREPROCESSOR_BYTES * 16 => {
                    return Err(bad("not a regular file of a few kilobytes".into()))
                }
                Ok(_) => {}
            }
            let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
            serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| bad(format!("not valid JSON: {e}")))
        };
        let Some(config) = read("config.json")? else {
            return Ok(None);
        };
        let preprocessor = read("preprocessor_config.json")?;
        Self::from_json(&config, preprocessor.as_ref())
    }

    /// From a parsed `config.json` and `preprocessor_config.json`; the released preprocessor
    /// values (§1.3) where the latter is absent. Fields that disagree are refused with both
    /// values.
    pub fn from_json(
        config: &Value,
        preprocessor: Option<&Value>,
    ) -> Result<Option<Self>, VisionError> {
        let Some(vision) = config.get("vision_config").filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let bad = |field: &str, message: String| VisionError::Config {
            field: format!("config.json {field}"),
            message,
        };
        let count = |v: &Value, field: &str, default: usize| -> Result<usize, VisionError> {
            match v.get(field.rsplit('.').next().unwrap_or(field)) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x
                    .as_u64()
                    .filter(|&n| n > 0)
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(field, format!("must be a positive integer, not {x}"))),
            }
        };
        let released = Geometry::default();
        let mut geometry = Geometry {
            patch: count(vision, "vision_config.patch_size", released.patch)?,
            temporal: count(
                vision,
                "vision_config.temporal_patch_size",
                released.temporal,
            )?,
            merge: count(vision, "vision_config.spatial_merge_size", released.merge)?,
            channels: count(vision, "vision_config.in_channels", released.channels)?,
            ..released
        };
        if geometry.channels != 3 {
            return Err(bad(
                "vision_config.in_channels",
                format!("is {} but images are RGB (3 channels)", geometry.channels),
            ));
        }
        let image_token_id =
            match config.get("image_token_id") {
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad("image_token_id", format!("must be a token id, not {v}")))?,
                None => return Err(bad(
                    "image_token_id",
                    "is missing, but vision_config is there: the image placeholder token is needed"
                        .into(),
                )),
            };
        if let Some(p) = preprocessor {
            read_preprocessor(p, &mut geometry)?;
        }
        Ok(Some(ImageInput {
            geometry,
            image_token_id,
        }))
    }
}

/// Applies `preprocessor_config.json` to `geometry` (pixel bounds, mean, std), refusing a
/// patch geometry that disagrees with `vision_config` and switched-off steps spindle always
/// runs.
fn read_preprocessor(p: &Value, geometry: &mut Geometry) -> Result<(), VisionError> {
    let bad = |field: &str, message: String| VisionError::Config {
        field: format!("preprocessor_config.json {field}"),
        message,
    };
    for (field, vision, want) in [
        ("patch_size", "patch_size", geometry.patch),
        (
            "temporal_patch_size",
            "temporal_patch_size",
            geometry.temporal,
        ),
        ("merge_size", "spatial_merge_size", geometry.merge),
    ] {
        if let Some(v) = p.get(field).filter(|v| !v.is_null()) {
            if v.as_u64() != Some(want as u64) {
                return Err(bad(
                    field,
                    format!("is {v} but config.json vision_config.{vision} is {want}"),
                ));
            }
        }
    }
    for field in ["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"] {
        if p.get(field).and_then(Value::as_bool) == Some(false) {
            return Err(bad(
                field,
                "is false: spindle always runs this step, as the released processors do".into(),
            ));
        }
    }
    if let Some(f) = p.get("rescale_factor").and_then(Value::as_f64) {
        if (f - 1.0 / 255.0).abs() > 1e-9 {
            return Err(bad(
                "rescale_factor",
                format!("is {f} but only 1/255 is supported"),
            ));
        }
    }
    let pixels = |v: Option<&Value>, field: &str| -> Result<Option<usize>, VisionError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| Some(n as usize))
                .ok_or_else(|| bad(field, format!("must be a positive pixel count, not {x}"))),
        }
    };
    let size = p.get("size").filter(|v| !v.is_null());
    if let Some(v) = size.filter(|v| !v.is_object()) {
        return Err(bad(
            "size",
            format!("must be an object with shortest_edge and longest_edge, not {v}"),
        ));
    }
    let min = pixels(
        size.and_then(|s| s.get("shortest_edge")),
        "size.shortest_edge",
    )?
    .or(pixels(p.get("min_pixels"), "min_pixels")?);
    let max = pixels(
        size.and_then(|s| s.get("longest_edge")),
        "size.longest_edge",
    )?
    .or(pixels(p.get("max_pixels"), "max_pixels")?);
    geometry.min_pixels = min.unwrap_or(geometry.min_pixels);
    geometry.max_pixels = max.unwrap_or(geometry.max_pixels);
    if geometry.min_pixels > geometry.max_pixels {
        return Err(bad(
            "size",
            format!(
                "shortest_edge {} (min pixels) is above longest_edge {} (max pixels)",
                geometry.min_pixels, geometry.max_pixels
            ),
        ));
    }
    for (field, target) in [
        ("image_mean", &mut geometry.mean),
        ("image_std", &mut geometry.std),
    ] {
        let Some(v) = p.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        let values: Option<Vec<f32>> = v
            .as_array()
            .filter(|a| a.len() == 3)
            .and_then(|a| a.iter().map(|x| x.as_f64().map(|x| x as f32)).collect());
        match values {
            Some(vals) if vals.iter().any(|s| !s.is_finite()) => {
                return Err(bad(field, format!("must be finite (as f32), not {v}")))
            }
            Some(vals) if field == "image_std" && vals.iter().any(|&s| s <= 0.0) => {
                return Err(bad(field, format!("must be positive, not {v}")))
            }
            Some(vals) => target.copy_from_slice(&vals),
            None => return Err(bad(field, format!("must be three numbers, not {v}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_text_only_config_has_no_image_input() {
        assert_eq!(
            ImageInput::from_json(&json!({"vocab_size": 9}), None),
            Ok(None)
        );
    }

    #[test]
    fn vision_config_and_the_preprocessor_give_the_geometry() {
        let config = json!({"image_token_id": 5, "vision_config": {"patch_size": 16,
            "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3}});
        let input = ImageInput::from_json(&config, None).unwrap().unwrap();
        assert_eq!(input.image_token_id, 5);
        assert_eq!(input.geometry, Geometry::default());
        let pre = json!({"size": {"shortest_edge": 1024, "longest_edge": 4096}, "patch_size": 16,
            "merge_size": 2, "image_mean": [0.1, 0.2, 0.3], "image_std": [0.5, 0.5, 0.25]});
        let g = ImageInput::from_json(&config, Some(&pre))
            .unwrap()
            .unwrap()
            .geometry;
        assert_eq!((g.min_pixels, g.max_pixels), (1024, 4096));
        assert_eq!((g.mean, g.std), ([0.1, 0.2, 0.3], [0.5, 0.5, 0.25]));
    }

    #[test]
    fn disagreements_are_refused_by_field() {
        let config = json!({"image_token_id": 5, "vision_config": {"patch_size": 16}});
        let field = |pre: Value| match ImageInput::from_json(&config, Some(&pre)) {
            Err(VisionError::Config { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            field(json!({"patch_size": 14})),
            "preprocessor_config.json patch_size"
        );
        assert_eq!(
            field(json!({"do_normalize": false})),
            "preprocessor_config.json do_normalize"
        );
        let missing = ImageInput::from_json(&json!({"vision_config": {}}), None);
        assert!(
            matches!(missing, Err(VisionError::Config { field, .. }) if field == "config.json image_token_id")
        );
        assert_eq!(
            field(json!({"size": 4096})),
            "preprocessor_config.json size"
        );
        assert_eq!(
            field(json!({"image_mean": [0.5, 1e300, 0.5]})),
            "preprocessor_config.json image_mean"
        );
    }

    #[test]
    fn the_fixture_checkpoint_reads() {
        let dir = spindle_testkit::fixture("qwen3_5_dense_vision");
        let input = ImageInput::from_model_dir(&dir).unwrap().unwrap();
        assert_eq!(input.image_token_id, 5);
        let want = Geometry {
            min_pixels: 4096,
            max_pixels: 262_144,
            ..Geometry::default()
        };
        assert_eq!(input.geometry, want);
    }
}
