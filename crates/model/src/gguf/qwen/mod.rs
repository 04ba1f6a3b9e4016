//! llama.cpp's Qwen hybrid architectures (`qwen35moe`, `qwen35`, `qwen3next`) mapped back to
//! the Hugging Face config and tensor layout, undoing what `convert_hf_to_gguf.py` does
//! (`conversion/qwen.py`: `Qwen3NextModel.modify_tensors`,
//! `_LinearAttentionVReorderBase.modify_tensors`, `Qwen2MoeModel.modify_tensors`):
//! - RMSNorm weights other than the GDN output norm are stored as `w + 1`;
//! - `A_log` is stored as `ssm_a = -exp(A_log)`, `dt_bias` as `ssm_dt.bias`, the conv kernel
//!   squeezed to [C, K];
//! - `qwen35`/`qwen35moe` with fewer key than value heads store the GDN value heads tiled
//!   ([v0 of every key head, v1 of every key head, ...]) instead of grouped by key head, in
//!   `attn_qkv`'s V rows, `attn_gate`, `ssm_alpha`/`ssm_beta`, `ssm_a`, `ssm_dt`, the conv's V
//!   channels and `ssm_out`'s columns;
//! - `qwen3next` splits `in_proj_qkvz` (interleaved per key head) into `attn_qkv` + `attn_gate`;
//! - routed experts are stacked per projection (`ffn_{gate,up,down}_exps` [E, out, in]).
//!
//! `qwen4exp` (Qwen3.8-Flash-Next, `conversion/qwen4exp.py`) is a `qwen35moe` plus
//! hyper-connections, the QSA indexer and PLE; [`qwen4exp`] maps what it adds.

mod config;
mod qwen4exp;
mod tensors;

pub use config::config_json;
pub(crate) use tensors::tensors;

use super::file::{GgufFile, TensorInfo, Value};
use crate::error::{ModelError, Result};

/// A llama.cpp architecture spindle maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arch {
    Qwen35Moe,
    Qwen35,
    Qwen3Next,
    Qwen4Exp,
}

impl Arch {
    fn name(self) -> &'static str {
        match self {
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen3Next => "qwen3next",
            Arch::Qwen4Exp => "qwen4exp",
        }
    }
}

fn err(f: &GgufFile, message: String) -> ModelError {
    ModelError::Gguf {
        path: f.path.clone(),
        message,
    }
}

fn arch_of(f: &GgufFile) -> Result<Arch> {
    let arch = f
        .get("general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| err(f, "metadata key `general.architecture` is missing".into()))?;
    match arch {
        "qwen35moe" => Ok(Arch::Qwen35Moe),
        "qwen35" => Ok(Arch::Qwen35),
        "qwen3next" => Ok(Arch::Qwen3Next),
        "qwen4exp" => Ok(Arch::Qwen4Exp),
        other => Err(err(
            f,
            format!(
                "metadata key `general.architecture` = {other:?}: not an architecture spindle runs (qwen35moe, qwen35, qwen3next, qwen4exp)"
            ),
        )),
    }
}

/// Tensor `name` and the index of the file holding it.
fn find<'a>(files: &'a [GgufFile], name: &str) -> Option<(usize, &'a TensorInfo)> {
    files
        .iter()
        .enumerate()
        .find_map(|(i, f)| f.tensors.iter().find(|t| t.name == name).map(|t| (i, t)))
}
