//! `spindle inspect`: what a checkpoint is, from its config.json alone.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::{json, Value};
use spindle_model::install::plan::{MemoryPlan, Residency};
use spindle_model::install::{self, Manifest};
use spindle_model::layout::{parameters_by_class, TensorClass};
use spindle_model::quant::WeightFormat;
use spindle_model::{FfnKind, MixerKind, ModelConfig};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A checkpoint directory (its config.json is read) or a path to a config.json file.
    #[arg(value_name = "DIR|CONFIG")]
    pub path: PathBuf,

    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Context length (tokens) the memory plan provisions KV cache and state for.
    #[arg(long, default_value_t = 4096)]
    pub context: usize,

    /// Weight format to plan for with a Hugging Face checkpoint (an install's own format is
    /// used for an install).
    #[arg(long, default_value = "bf16", value_parser = |s: &str| s.parse::<WeightFormat>().map_err(|e| e.to_string()))]
    pub quant: WeightFormat,
}

/// Parameters per tensor class (the model crate's layout) and the share one token uses.
struct ParamCounts {
    /// `(class, total, active per token)`.
    rows: Vec<(TensorClass, u64, u64)>,
}

impl ParamCounts {
    fn from_config(config: &ModelConfig) -> Self {
        let rows = parameters_by_class(config)
            .into_iter()
            .map(|(class, total)| (class, total, active_share(config, class, total)))
            .collect();
        ParamCounts { rows }
    }

    fn total(&self) -> u64 {
        self.rows.iter().map(|r| r.1).sum()
    }

    fn active(&self) -> u64 {
        self.rows.iter().map(|r| r.2).sum()
    }
}

/// How many of a class's `total` parameters one token uses: top-k of the routed experts, a
/// few rows of the n-gram table (counted as none), everything else whole (the embedding too,
/// as model cards count it).
fn active_share(config: &ModelConfig, class: TensorClass, total: u64) -> u64 {
    match (class, &config.moe) {
        (TensorClass::RoutedExperts, Some(moe)) => {
            total / moe.num_experts as u64 * moe.top_k as u64
        }
        (TensorClass::NgramTable, _) => 0,
        _ => total,
    }
}

pub fn run(args: &InspectArgs) -> Result<ExitCode> {
    let config = load_config(&args.path)?;
    let params = ParamCounts::from_config(&config);
    let (quant, vision_format) = if install::is_install(&args.path) {
        let manifest = Manifest::read(&args.path.join(install::MANIFEST))?;
        (manifest.quant_format(), manifest.vision_format())
    } else {
        (args.quant, WeightFormat::Bf16)
    };
    let plan = MemoryPlan::checked(&config, quant, args.context).ok_or_else(|| {
        anyhow::anyhow!(
            "--context {}: the KV cache at that many tokens would take more than 2^64 bytes; \
             give a context this model could hold (max_position_embeddings is {})",
            args.context,
            config.max_position_embeddings
        )
    })?;
    let plan = plan.with_vision_format(&config, vision_format);
    if args.json {
        let mut value = to_json(&args.path, &config, &params);
        value["memory_plan"] = plan_json(&plan, quant);
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print_table(&args.path, &config, &params);
        print_plan(&plan, quant);
    }
    Ok(ExitCode::SUCCESS)
}

/// Bytes in GB, MB or KB, whichever reads best.
fn gb(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..=999_999 => format!("{:.1} KB", b / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} MB", b / 1e6),
        _ => format!("{:.2} GB", b / 1e9),
    }
}

/// Slot counts worth showing: top-k, twice that, and every expert.
fn slot_examples(plan: &MemoryPlan) -> Vec<usize> {
    let mut slots = vec![plan.top_k, 2 * plan.top_k, plan.experts_per_layer];
    slots.retain(|&s| s > 0 && s <= plan.experts_per_layer);
    slots.dedup();
    slots
}

fn print_plan(plan: &MemoryPlan, quant: WeightFormat) {
    println!();
    println!(
        "  memory plan ({quant}, one session of {} tokens)",
        plan.context
    );
    for (class, bytes, format) in &plan.classes {
        println!("  {:<18} {:>12}  {format}", class.name(), gb(*bytes));
    }
    if plan.vision_bytes > 0 {
        println!(
            "  {:<18} {:>12}  bf16 (image input; --no-vision skips it)",
            "vision tower",
            gb(plan.vision_bytes)
        );
    }
    println!(
        "  {:<18} {:>12}  at {} tokens",
        "kv + gdn state",
        gb(plan.state_bytes),
        plan.context
    );
    println!("  peak RSS");
    println!(
        "    {:<16} {:>12}",
        "resident",
        gb(plan.peak_rss(Residency::Resident))
    );
    println!(
        "    {:<16} {:>12}  (at most; the page cache keeps what fits)",
        "mapped",
        gb(plan.peak_rss(Residency::Mapped))
    );
    for slots in slot_examples(plan) {
        println!(
            "    {:<16} {:>12}",
            format!("streamed, {slots} slots"),
            gb(plan.peak_rss(Residency::Streamed { slots }))
        );
    }
    if plan.moe_layers > 0 {
        println!(
            "    (each slot: {} per MoE layer × {} layers)",
            gb(plan.record_bytes),
            plan.moe_layers
        );
    }
}

fn plan_json(plan: &MemoryPlan, quant: WeightFormat) -> Value {
    let classes: serde_json::Map<String, Value> = plan
        .classes
        .iter()
        .map(|(c, b, f)| (c.name().to_owned(), json!({"bytes": b, "format": f})))
        .collect();
    let streamed: Vec<Value> = slot_examples(plan)
        .into_iter()
        .map(|slots| json!({"slots": slots, "peak_rss_bytes": plan.peak_rss(Residency::Streamed { slots })}))
        .collect();
    json!({
        "quant": quant.name(),
        "context": plan.context,
        "classes": classes,
        "state_bytes": plan.state_bytes,
        "vision_bytes": plan.vision_bytes,
        "expert_record_bytes": plan.record_bytes,
        "moe_layers": plan.moe_layers,
        "peak_rss_bytes": {
            "resident": plan.peak_rss(Residency::Resident),
            "mapped": plan.peak_rss(Residency::Mapped),
            "streamed": streamed,
        },
    })
}

/// `DIR/config.json` or the config file itself; the library's error is passed on as is, so
/// refusals (FP8 weights, unknown families) read the same everywhere.
fn load_config(path: &Path) -> Result<ModelConfig> {
    let config = if path.is_dir() || spindle_model::gguf::is_gguf(path) {
        ModelConfig::from_dir(path)?
    } else if path.is_file() {
        ModelConfig::from_file(path)?
    } else {
        bail!(
            "{} does not exist (expected a checkpoint directory or a config.json)",
            path.display()
        );
    };
    Ok(config)
}

fn mixer_letter(kind: MixerKind) -> char {
    match kind {
        MixerKind::LinearAttention => 'G',
        MixerKind::FullAttention => 'A',
    }
}

fn ffn_letter(kind: FfnKind) -> char {
    match kind {
        FfnKind::Dense => 'D',
        FfnKind::Moe => 'M',
    }
}

/// `GGGA ×10` when the sequence is a repeated unit, else the whole sequence.
#[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` is newer than rust-version 1.85
fn pattern(letters: &[char]) -> String {
    let n = letters.len();
    let period = (1..=n)
        .find(|&p| {
            n % p == 0
                && letters
                    .iter()
                    .enumerate()
                    .all(|(i, c)| *c == letters[i % p])
        })
        .unwrap_or(n);
    let unit: String = letters[..period].iter().collect();
    if period < n {
        format!("{unit} ×{}", n / period)
    } else {
        unit
    }
}

fn human(n: u64) -> String {
    let x = n as f64;
    match n {
        0..=9_999 => n.to_string(),
        10_000..=999_999 => format!("{:.1}K", x / 1e3),
        1_000_000..=999_999_999 => format!("{:.2}M", x / 1e6),
        _ => format!("{:.2}B", x / 1e9),
    }
}

/// How the checkpoint stores its weights, as the config says.
fn source_format(path: &Path, c: &ModelConfig) -> String {
    if spindle_model::gguf::is_gguf(path) {
        return match spindle_model::gguf::describe(path) {
            Ok(d)
                if ["Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"]
                    .iter()
                    .any(|t| d.contains(&format!("{t} x"))) =>
            {
                format!(
                    "{d}; the quantized ones run in their blocks (CPU: memory-mapped; CUDA: uploaded as stored) unless --quant is given"
                )
            }
            Ok(d) => d,
            Err(e) => e.to_string(),
        };
    }
    match &c.fp8 {
        Some(fp8) => format!(
            "block FP8 (e4m3, {}x{} blocks; dequantized on load)",
            fp8.block[0], fp8.block[1]
        ),
        None => "as stored (bf16/f16/f32 safetensors)".into(),
    }
}

fn print_table(path: &Path, c: &ModelConfig, params: &ParamCounts) {
    let mixers: Vec<char> = c.layers.iter().map(|l| mixer_letter(l.mixer)).collect();
    let ffns: Vec<char> = c.layers.iter().map(|l| ffn_letter(l.ffn)).collect();
    let full = mixers.iter().filter(|&&m| m == 'A').count();
    let moe_layers = ffns.iter().filter(|&&f| f == 'M').count();
    let a = &c.attention;
    let g = &c.gdn;
    let r = &c.rope;

    println!("{}", path.display());
    let layout = if c.multimodal_wrapper {
        "multimodal wrapper: text_config, model.language_model.*"
    } else {
        "text-only: model.*"
    };
    println!("  family          {} ({layout})", c.family.model_type());
    println!("  weights         {}", source_format(path, c));
    println!("  vocab           {}", c.vocab_size);
    println!("  hidden          {}", c.hidden_size);
    println!(
        "  layers          {}: {} GDN + {full} full attention; {moe_layers} MoE + {} dense FFN",
        c.num_layers(),
        c.num_layers() - full,
        c.num_layers() - moe_layers
    );
    println!(
        "  mixers          {}  (G = Gated DeltaNet, A = gated full attention)",
        pattern(&mixers)
    );
    println!(
        "  ffns            {}  (M = MoE, D = dense MLP)",
        pattern(&ffns)
    );
    println!(
        "  attention       {} query heads, {} KV heads, head_dim {}",
        a.num_heads, a.num_kv_heads, a.head_dim
    );
    println!(
        "  gdn             {} key heads × {}, {} value heads × {}, conv kernel {}",
        g.num_key_heads, g.key_head_dim, g.num_value_heads, g.value_head_dim, g.conv_kernel
    );
    if let Some(m) = &c.moe {
        println!(
            "  moe             {} experts, top-{}, expert intermediate {}, shared expert {}",
            m.num_experts, m.top_k, m.expert_intermediate, m.shared_intermediate
        );
    }
    if let (Some(i), true) = (c.intermediate_size, moe_layers < c.num_layers()) {
        println!("  dense mlp       intermediate {i}");
    }
    let mrope = match &r.mrope_section {
        Some(s) => format!(
            ", mrope_section {s:?}{}",
            if r.mrope_interleaved {
                " interleaved"
            } else {
                ""
            }
        ),
        None => String::new(),
    };
    println!(
        "  rope            theta {}, rotary_dim {} of head_dim {} (partial_rotary_factor {}){mrope}",
        r.theta, r.rotary_dim, a.head_dim, r.partial_rotary_factor
    );
    if let Some(hc) = &c.hyper {
        println!(
            "  hyper-conn      {} residual streams, low-rank mix {}",
            hc.streams, hc.lowrank
        );
    }
    if let Some(ple) = &c.ple {
        let layers: Vec<usize> = ple.layers.iter().map(|l| l + 1).collect();
        println!(
            "  ple             layers {layers:?} (1-indexed), {}-grams, {} hash heads, embed_dim {}",
            ple.ngram_size,
            ple.heads(),
            ple.embed_dim
        );
    }
    if let Some(q) = &c.qsa {
        println!(
            "  qsa             {} indexer heads × {}, budget {} tokens in blocks of {}",
            q.n_heads, q.head_dim, q.budget, q.compress_ratio
        );
    }
    println!("  context         {} tokens", c.max_position_embeddings);
    println!("  eos             {:?}", c.eos_token_ids);
    println!("  tied embeddings {}", c.tie_word_embeddings);
    println!();
    println!(
        "  {:<18} {:>12} {:>14}",
        "parameters", "total", "active/token"
    );
    for &(class, total, active) in &params.rows {
        if total > 0 {
            println!(
                "  {:<18} {:>12} {:>14}",
                class.name(),
                human(total),
                human(active)
            );
        }
    }
    println!(
        "  {:<18} {:>12} {:>14}",
        "all",
        human(params.total()),
        human(params.active())
    );
}

fn to_json(path: &Path, c: &ModelConfig, params: &ParamCounts) -> Value {
    let classes: serde_json::Map<String, Value> = params
        .rows
        .iter()
        .map(|&(class, total, active)| {
            (
                class.name().to_owned(),
                json!({ "total": total, "active": active }),
            )
        })
        .collect();
    json!({
        "path": path.display().to_string(),
        "family": c.family.model_type(),
        "multimodal_wrapper": c.multimodal_wrapper,
        "source_format": source_format(path, c),
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_layers": c.num_layers(),
        "layers": c.layers.iter().map(|l| json!({
            "mixer": match l.mixer {
                MixerKind::LinearAttention => "linear_attention",
                MixerKind::FullAttention => "full_attention",
            },
            "ffn": match l.ffn { FfnKind::Dense => "dense", FfnKind::Moe => "moe" },
        })).collect::<Vec<_>>(),
        "attention": {
            "num_heads": c.attention.num_heads,
            "num_kv_heads": c.attention.num_kv_heads,
            "head_dim": c.attention.head_dim,
        },
        "gdn": {
            "num_key_heads": c.gdn.num_key_heads,
            "num_value_heads": c.gdn.num_value_heads,
            "key_head_dim": c.gdn.key_head_dim,
            "value_head_dim": c.gdn.value_head_dim,
            "conv_kernel": c.gdn.conv_kernel,
        },
        "moe": c.moe.as_ref().map(|m| json!({
            "num_experts": m.num_experts,
            "top_k": m.top_k,
            "expert_intermediate": m.expert_intermediate,
            "shared_intermediate": m.shared_intermediate,
        })),
        "intermediate_size": c.intermediate_size,
        "rope": {
            "theta": c.rope.theta,
            "partial_rotary_factor": c.rope.partial_rotary_factor,
            "rotary_dim": c.rope.rotary_dim,
            "mrope_section": c.rope.mrope_section,
            "mrope_interleaved": c.rope.mrope_interleaved,
        },
        "hyper_connections": c.hyper.as_ref().map(|hc| json!({ "streams": hc.streams, "lowrank": hc.lowrank })),
        "ple": c.ple.as_ref().map(|ple| json!({
            "layers": ple.layers,
            "embed_dim": ple.embed_dim,
            "ngram_size": ple.ngram_size,
            "heads": ple.heads(),
        })),
        "qsa": c.qsa.as_ref().map(|q| json!({
            "n_heads": q.n_heads,
            "head_dim": q.head_dim,
            "budget": q.budget,
            "compress_ratio": q.compress_ratio,
        })),
        "max_position_embeddings": c.max_position_embeddings,
        "eos_token_ids": c.eos_token_ids,
        "tie_word_embeddings": c.tie_word_embeddings,
        "parameters": classes,
        "total_params": params.total(),
        "active_params": params.active(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_compress_repeated_units() {
        let chars = |s: &str| s.chars().collect::<Vec<_>>();
        assert_eq!(pattern(&chars("GGGAGGGAGGGA")), "GGGA ×3");
        assert_eq!(pattern(&chars("MMMM")), "M ×4");
        assert_eq!(pattern(&chars("GGA")), "GGA");
        assert_eq!(pattern(&chars("GGAGA")), "GGAGA");
    }

    #[test]
    fn human_numbers() {
        assert_eq!(human(512), "512");
        assert_eq!(human(34_660_000_000), "34.66B");
        assert_eq!(human(508_559_360), "508.56M");
    }
}
