//! Sampling flags shared by the commands that generate text.

use clap::Args;
use spindle_runtime::sampling::SamplingParams;

#[derive(Debug, Args, Clone, Default)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy. Default: the model's generation_config.json.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the most likely tokens up to this probability mass.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens below this fraction of the most likely one.
    #[arg(long)]
    pub min_p: Option<f32>,
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// OpenAI presence penalty (may be negative).
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty (may be negative).
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The model's defaults with every flag given on the command line applied.
    pub fn apply(&self, defaults: &SamplingParams) -> SamplingParams {
        let mut p = defaults.clone();
        if let Some(t) = self.temperature {
            p.temperature = t;
        }
        if let Some(k) = self.top_k {
            p.top_k = k;
        }
        if let Some(v) = self.top_p {
            p.top_p = v;
        }
        if let Some(v) = self.min_p {
            p.min_p = v;
        }
        if let Some(v) = self.repetition_penalty {
            p.repetition_penalty = v;
        }
        if let Some(v) = self.presence_penalty {
            p.presence_penalty = v;
        }
        if let Some(v) = self.frequency_penalty {
            p.frequency_penalty = v;
        }
        if self.seed.is_some() {
            p.seed = self.seed;
        }
        p
    }
}
