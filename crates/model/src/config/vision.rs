//! `vision_config` and the image token ids of a Qwen3.5/3.6 checkpoint (shared docs
//! `VISION.md` §1): the vision tower's shapes, checked once here.

use std::path::Path;

use serde_json::{Map, Value};
use spindle_vision::Geometry;

use super::Fields;
use crate::error::{ModelError, Result};
use crate::quant::WeightFormat;

/// The Qwen3-VL vision tower without DeepStack (`VISION.md` §1.1, §3).
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    /// Blocks (`depth`).
    pub depth: usize,
    /// D: the tower's width (`hidden_size`).
    pub hidden: usize,
    /// n_h: attention heads; the head size is D / n_h.
    pub heads: usize,
    /// I: the block MLP width (`intermediate_size`).
    pub intermediate: usize,
    /// P: patch side in pixels.
    pub patch: usize,
    /// T_p: frames per patch (an image is repeated to T_p frames).
    pub temporal: usize,
    /// m: patches merged per side into one LLM token.
    pub merge: usize,
    pub in_channels: usize,
    /// The merger's output width (= the text model's hidden size).
    pub out_hidden: usize,
    /// S: the learned position table is S x S (`num_position_embeddings` = S²).
    pub pos_side: usize,
    /// θ_v of the 2-D rotary embedding (10000 released).
    pub rope_theta: f64,
    pub tokens: VisionTokens,
}

/// The special ids of image input (top-level `image_token_id`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct VisionTokens {
    /// `<|image_pad|>`: each is replaced by one image feature row.
    pub image: u32,
    pub video: Option<u32>,
    pub vision_start: Option<u32>,
    pub vision_end: Option<u32>,
}

impl VisionConfig {
    /// Whether `image` fits this tower, and why not: patch rows of the tower's width, a grid
    /// divisible by the merge size, and as many pixel values as the grid says (both backends
    /// check this before encoding).
    pub fn fits(&self, image: &spindle_vision::PreparedImage) -> std::result::Result<(), String> {
        let (g, m) = (image.grid, self.merge);
        if image.row_len != self.patch_row() {
            return Err(format!(
                "patch rows of {} values, but the vision tower takes {} (channels x temporal x patch²)",
                image.row_len,
                self.patch_row()
            ));
        }
        if g.t == 0 || g.h == 0 || g.w == 0 || g.h % m != 0 || g.w % m != 0 {
            return Err(format!(
                "grid {}x{}x{} patches: every side must be positive and h, w multiples of the merge size {m}",
                g.t, g.h, g.w
            ));
        }
        if image.pixels.len() != g.patches() * image.row_len {
            return Err(format!(
                "{} pixel values for {} patches of {}",
                image.pixels.len(),
                g.patches(),
                image.row_len
            ));
        }
        Ok(())
    }

    /// The head size d = D / n_h.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Width of one patch row: channels x frames x P x P (1536 released).
    pub fn patch_row(&self) -> usize {
        self.in_channels * self.temporal * self.patch * self.patch
    }

    /// How images are cut for this tower: the patch shapes from `vision_config`, the pixel
    /// bounds and normalisation from `DIR/preprocessor_config.json` when it exists (released
    /// values otherwise). `size.shortest_edge` / `longest_edge` there are pixel counts.
    pub fn geometry(&self, dir: &Path) -> Result<Geometry> {
        let mut geometry = Geometry {
            patch: self.patch,
            temporal: self.temporal,
            merge: self.merge,
            channels: self.in_channels,
            ..Geometry::default()
        };
        let path = dir.join("preprocessor_config.json");
        if !path.is_file() {
            return Ok(geometry);
        }
        let text =
            crate::fs::read_bounded_to_string(&path, crate::fs::CONFIG_LIMIT).map_err(|error| {
                ModelError::Io {
                    path: path.clone(),
                    error,
                }
            })?;
        let value: Value = serde_json::from_str(&text).map_err(|error| ModelError::Json {
            path: path.clone(),
            error,
        })?;
        let bad = |message: String| ModelError::Config {
            path: path.clone(),
            message,
        };
        let pixels = |key: &str| -> Result<Option<usize>> {
            match value.get("size").and_then(|s| s.get(key)) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| {
                        bad(format!("size.{key} = {v}: expected a positive pixel count"))
                    }),
            }
        };
        if let Some(n) = pixels("shortest_edge")? {
            geometry.min_pixels = n;
        }
        if let Some(n) = pixels("longest_edge")? {
            geometry.max_pixels = n;
        }
        if geometry.min_pixels > geometry.max_pixels {
            return Err(bad(format!(
                "size.shortest_edge {} is above size.longest_edge {} (both are pixel counts)",
                geometry.min_pixels, geometry.max_pixels
            )));
        }
        for (key, target) in [
            ("image_mean", &mut geometry.mean),
            ("image_std", &mut geometry.std),
        ] {
            match value.get(key) {
                None | Some(Value::Null) => {}
                Some(v) => {
                    let list: Option<Vec<f32>> = v
                        .as_array()
                        .filter(|a| a.len() == 3)
                        .and_then(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect());
                    match list {
                        Some(l) if key == "image_mean" || l.iter().all(|&s| s > 0.0) => {
                            target.copy_from_slice(&l)
                        }
                        _ => {
                            return Err(bad(format!(
                                "{key} = {v}: expected three numbers (std positive)"
                            )))
                        }
                    }
                }
            }
        }
        for (key, want) in [
            ("patch_size", self.patch),
            ("temporal_patch_size", self.temporal),
            ("merge_size", self.merge),
        ] {
            if let Some(v) = value.get(key).filter(|v| !v.is_null()) {
                if v.as_u64() != Some(want as u64) {
                    return Err(bad(format!(
                        "{key} = {v} but config.json's vision_config says {want}"
                    )));
                }
            }
        }
        Ok(geometry)
    }

    /// Bytes of the tower as the CPU engine holds it: the matrices as stored (bf16), the
    /// position table, biases and norms copied as f32.
    pub fn loaded_bytes(&self) -> usize {
        self.loaded_bytes_as(WeightFormat::Bf16)
    }

    /// [`VisionConfig::loaded_bytes`] for a tower whose block and merger matrices are stored in
    /// `format` (an install's `--vision-quant`): each matrix whose rows are whole groups of
    /// `format` takes its codes and scales, the rest (and the patch embedding, a Conv3d kernel
    /// that installs keep as stored) bf16.
    pub fn loaded_bytes_as(&self, format: WeightFormat) -> usize {
        let (d, i, row) = (self.hidden, self.intermediate, self.patch_row());
        let wide = d * self.merge * self.merge;
        let bytes = |rows: usize, cols: usize| {
            if format != WeightFormat::Bf16 && format.fits(cols) {
                format.code_bytes(rows, cols) + format.scale_bytes(rows, cols)
            } else {
                rows * cols * 2
            }
        };
        let block = bytes(3 * d, d) + bytes(d, d) + bytes(i, d) + bytes(d, i);
        let stored =
            d * row * 2 + self.depth * block + bytes(wide, wide) + bytes(self.out_hidden, wide);
        let matrices = d * row
            + self.depth * (3 * d * d + d * d + i * d + d * i)
            + wide * wide
            + self.out_hidden * wide;
        stored + (self.parameters() - matrices) * 4
    }

    /// Parameters of the tower (every matrix and vector), for the memory plan.
    pub fn parameters(&self) -> usize {
        let (d, i, row) = (self.hidden, self.intermediate, self.patch_row());
        let block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (i * d + i) + (d * i + d);
        let wide = d * self.merge * self.merge;
        let merger = 2 * d + (wide * wide + wide) + (self.out_hidden * wide + self.out_hidden);
        (d * row + d) + self.pos_side * self.pos_side * d + self.depth * block + merger
    }
}

/// Reads `vision_config` (None when the checkpoint has none). `text_hidden` is the text
/// model's hidden size, which the merger's output must equal.
pub(super) fn parse(top: &Fields, text_hidden: usize) -> Result<Option<VisionConfig>> {
    let Some(raw) = top.get("vision_config") else {
        return Ok(None);
    };
    let empty = Map::new();
    let obj = match raw {
        Value::Object(m) => m,
        other => return Err(top.err(format!("vision_config = {other}: expected an object"))),
    };
    let f = Fields {
        obj,
        prefix: "vision_config.",
        path: top.path,
    };
    if let Some(act) = f.opt_str("hidden_act")? {
        if act != "gelu_pytorch_tanh" {
            return Err(f.err(format!(
                "vision_config.hidden_act = {act:?}: the Qwen3.5 tower uses \"gelu_pytorch_tanh\""
            )));
        }
    }
    if let Some(list) = f.opt_usize_list("deepstack_visual_indexes")? {
        if !list.is_empty() {
            return Err(f.err(format!(
                "vision_config.deepstack_visual_indexes = {list:?}: DeepStack is not part of \
                 Qwen3.5/3.6 (transformers ignores it), so spindle refuses it rather than guess"
            )));
        }
    }
    let rope = match f.get("rope_parameters") {
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(f.err(format!(
                "vision_config.rope_parameters = {other}: expected an object"
            )))
        }
        None => &empty,
    };
    let rope_fields = Fields {
        obj: rope,
        prefix: "vision_config.rope_parameters.",
        path: top.path,
    };
    let rope_theta = rope_fields.opt_f64("rope_theta")?.unwrap_or(10000.0);
    if !(rope_theta > 1.0) {
        return Err(f.err(format!(
            "vision_config.rope_parameters.rope_theta = {rope_theta}: must be > 1"
        )));
    }
    let defaulted = |key: &str, default: usize| -> Result<usize> {
        match f.opt_usize(key)? {
            Some(0) => Err(f.err(format!("vision_config.{key} = 0: must be positive"))),
            Some(n) => Ok(n),
            None => Ok(default),
        }
    };
    let positions = defaulted("num_position_embeddings", 2304)?;
    let pos_side = (positions as f64).sqrt().round() as usize;
    if pos_side * pos_side != positions {
        return Err(f.err(format!(
            "vision_config.num_position_embeddings = {positions}: must be a square (an S x S table)"
        )));
    }
    let config = VisionConfig {
        depth: defaulted("depth", 27)?,
        hidden: defaulted("hidden_size", 1152)?,
        heads: defaulted("num_heads", 16)?,
        intermediate: defaulted("intermediate_size", 4304)?,
        patch: defaulted("patch_size", 16)?,
        temporal: defaulted("temporal_patch_size", 2)?,
        merge: defaulted("spatial_merge_size", 2)?,
        in_channels: defaulted("in_channels", 3)?,
        out_hidden: defaulted("out_hidden_size", text_hidden)?,
        pos_side,
        rope_theta,
        tokens: VisionTokens {
            image: token(top, "image_token_id", 248_056)?,
            video: Some(token(top, "video_token_id", 248_057)?),
            vision_start: Some(token(top, "vision_start_token_id", 248_053)?),
            vision_end: Some(token(top, "vision_end_token_id", 248_054)?),
        },
    };
    if config.hidden % config.heads != 0 || config.head_dim() % 4 != 0 {
        return Err(f.err(format!(
            "vision_config.hidden_size {} over num_heads {} must give a head size divisible by 4 \
             (the 2-D rotary embedding uses d/4 frequencies per axis)",
            config.hidden, config.heads
        )));
    }
    if config.in_channels != 3 {
        return Err(f.err(format!(
            "vision_config.in_channels = {}: images are RGB (3)",
            config.in_channels
        )));
    }
    if config.out_hidden != text_hidden {
        return Err(f.err(format!(
            "vision_config.out_hidden_size {} but the text hidden_size is {text_hidden}: image \
             features replace token embeddings, so the two must agree",
            config.out_hidden
        )));
    }
    Ok(Some(config))
}

fn token(top: &Fields, key: &str, default: u32) -> Result<u32> {
    match top.opt_usize(key)? {
        None => Ok(default),
        Some(n) => u32::try_from(n).map_err(|_| top.err(format!("{key} = {n}: not a token id"))),
    }
}

#[cfg(test)]
mod tests {
    use crate::ModelConfig;
    use std::path::Path;

    const RELEASED: &str = include_str!("../../../../fixtures/configs/qwen3_6_35b_a3b.config.json");

    fn with(edit: impl FnOnce(&mut serde_json::Value)) -> crate::Result<ModelConfig> {
        let mut v: serde_json::Value = serde_json::from_str(RELEASED).unwrap();
        edit(&mut v);
        ModelConfig::from_json_str(&v.to_string(), Path::new("config.json"))
    }

    #[test]
    fn the_released_vision_config_parses() {
        let config = with(|_| {}).unwrap();
        let v = config.vision.unwrap();
        assert_eq!(
            (v.depth, v.hidden, v.heads, v.intermediate),
            (27, 1152, 16, 4304)
        );
        assert_eq!((v.patch, v.temporal, v.merge, v.pos_side), (16, 2, 2, 48));
        assert_eq!(
            (v.out_hidden, v.rope_theta, v.patch_row()),
            (2048, 10000.0, 1536)
        );
        assert_eq!(v.tokens.image, 248_056);
        assert_eq!(v.tokens.vision_start, Some(248_053));
    }

    #[test]
    fn disagreeing_vision_fields_are_refused_by_name() {
        let err = |edit: fn(&mut serde_json::Value)| with(edit).unwrap_err().to_string();
        let m = err(|v| v["vision_config"]["deepstack_visual_indexes"] = serde_json::json!([8]));
        assert!(m.contains("deepstack_visual_indexes"), "{m}");
        let m = err(|v| v["vision_config"]["out_hidden_size"] = 5120.into());
        assert!(
            m.contains("out_hidden_size 5120") && m.contains("2048"),
            "{m}"
        );
        let m = err(|v| v["vision_config"]["num_position_embeddings"] = 2300.into());
        assert!(m.contains("num_position_embeddings = 2300"), "{m}");
        let m = err(|v| v["vision_config"]["num_heads"] = 7.into());
        assert!(m.contains("num_heads 7"), "{m}");
        let m = err(|v| v["vision_config"]["hidden_act"] = "gelu".into());
        assert!(m.contains("hidden_act"), "{m}");
    }

    #[test]
    fn geometry_reads_the_preprocessor_config() {
        let v = with(|_| {}).unwrap().vision.unwrap();
        let dir = tempfile::tempdir().unwrap();
        // Without the file: the released values.
        assert_eq!(
            v.geometry(dir.path()).unwrap(),
            spindle_vision::Geometry::default()
        );
        let file = dir.path().join("preprocessor_config.json");
        std::fs::write(
            &file,
            r#"{"size": {"longest_edge": 1000000, "shortest_edge": 4096}, "patch_size": 16,
                "image_mean": [0.4, 0.5, 0.6], "image_std": [0.2, 0.3, 0.4]}"#,
        )
        .unwrap();
        let g = v.geometry(dir.path()).unwrap();
        assert_eq!((g.min_pixels, g.max_pixels), (4096, 1_000_000));
        assert_eq!((g.mean, g.std), ([0.4, 0.5, 0.6], [0.2, 0.3, 0.4]));
        std::fs::write(&file, r#"{"patch_size": 14}"#).unwrap();
        let m = v.geometry(dir.path()).unwrap_err().to_string();
        assert!(m.contains("patch_size = 14") && m.contains("16"), "{m}");
        std::fs::write(&file, r#"{"image_std": [0.5, 0.0, 0.5]}"#).unwrap();
        let m = v.geometry(dir.path()).unwrap_err().to_string();
        assert!(m.contains("image_std"), "{m}");
    }
}
