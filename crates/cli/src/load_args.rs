//! Flags that choose how a model is loaded, shared by every command that runs one.

use std::sync::Arc;

use clap::Args;
use spindle_engine::LoadOptions;
use spindle_model::quant::QuantFormat;

#[derive(Debug, Args, Clone)]
pub struct LoadArgs {
    /// Weight format of the large projections: bf16 (as stored), or q8 / q4 quantized on load
    /// (int8 / int4, one f16 scale per 32 weights).
    #[arg(long, default_value = "bf16", value_parser = parse_quant)]
    pub quant: QuantFormat,
}

fn parse_quant(s: &str) -> Result<QuantFormat, String> {
    s.parse::<QuantFormat>().map_err(|e| e.to_string())
}

impl LoadArgs {
    /// Engine options, with a progress bar while weights are quantized.
    pub fn options(&self) -> LoadOptions {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("quantizing to {msg} [{bar:30}] {pos}/{len} matrices")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(self.quant.name());
        let progress = move |done: usize, total: usize| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            if done == total {
                bar.finish_and_clear();
            }
        };
        LoadOptions {
            quant: self.quant,
            progress: (self.quant != QuantFormat::Bf16).then(|| Arc::new(progress) as Arc<dyn Fn(usize, usize) + Send + Sync>),
        }
    }
}
