//! A model directory opened for text generation: the backend that runs it, the tokenizer, the
//! chat template and the generation defaults, all from the checkpoint's own files.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};
use spindle_cpu::LoadOptions;
use spindle_model::ModelConfig;
use spindle_text::{Cancel, ChatTemplate, TextError, Tokenizer};

use crate::backend::{Backend, BackendSession, Device};
use crate::constraint::{Constraint, Grammar, Grammars};
use crate::error::{Result, RuntimeError};
use crate::sampling::{GenerationConfigValues, SamplingParams};

/// What a request asks the model to continue.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Messages rendered with the checkpoint's chat template.
    Chat {
        messages: Value,
        tools: Option<Value>,
        /// Extra template variables (`enable_thinking`, `force_thinking`, ...).
        vars: Map<String, Value>,
        add_generation_prompt: bool,
    },
    /// Plain text, tokenized as is. With `special_tokens`, spellings of special tokens
    /// (`<|im_start|>`) become those tokens (the default of a raw prompt, which is trusted);
    /// without, they are encoded as plain text.
    Text { text: String, special_tokens: bool },
    /// Token ids.
    Tokens(Vec<u32>),
}

/// A rendered and tokenized prompt.
#[derive(Clone, Debug)]
pub struct PreparedPrompt {
    /// The prompt text (empty for a token prompt).
    pub text: String,
    pub ids: Vec<u32>,
    /// True when the prompt ends inside an open `<think>` block, so generation starts as
    /// reasoning.
    pub starts_in_reasoning: bool,
}

pub struct Model {
    /// The engine that runs the model: the CPU engine or, with the `cuda` feature, a GPU.
    pub backend: Backend,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    /// Sampling defaults from `generation_config.json` (greedy when absent).
    pub defaults: SamplingParams,
    /// End-of-sequence ids: config.json and generation_config.json together.
    pub eos_ids: Vec<u32>,
    pub dir: PathBuf,
    /// The token trie structured outputs walk, built on first use ([`Model::constraint`]).
    grammars: OnceLock<std::result::Result<Grammars, String>>,
}

impl Model {
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_with(dir, &LoadOptions::default())
    }

    /// [`Model::load`] with engine options (weight format, expert residency), on the CPU.
    pub fn load_with(dir: &Path, options: &LoadOptions) -> Result<Self> {
        Self::load_on(dir, Device::Cpu, options)
    }

    /// [`Model::load_with`] on `device` (see [`Backend::load`] for what CUDA refuses). The
    /// backend is loaded first, so a machine without CUDA fails before anything else is read.
    pub fn load_on(dir: &Path, device: Device, options: &LoadOptions) -> Result<Self> {
        let backend = Backend::load(dir, device, options)?;
        let tokenizer = Arc::new(load_tokenizer(dir)?);
        check_tokenizer_fits(&tokenizer, backend.config().vocab_size)?;
        let template = match load_chat_template(dir) {
            Ok(t) => {
                // Its render worker forked now, before sessions and requests exist.
                t.start_worker();
                Some(t)
            }
            Err(TextError::NoChatTemplate { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        let generation = read_generation_config(dir)?;
        let mut eos_ids = backend.config().eos_token_ids.clone();
        for id in generation.eos_ids {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        Ok(Model {
            backend,
            tokenizer,
            template,
            defaults: SamplingParams::from_generation_config(&generation.values),
            eos_ids,
            dir: dir.to_owned(),
            grammars: OnceLock::new(),
        })
    }

    /// Compiles a structured-output grammar for one sequence (the model's token trie is built
    /// on the first call). A bad grammar is [`RuntimeError::Grammar`].
    pub fn constraint(&self, grammar: &Grammar) -> Result<Constraint> {
        self.grammars()?.compile(grammar)
    }

    /// The model's token trie for structured outputs and token bytes, built on first use.
    pub fn grammars(&self) -> Result<&Grammars> {
        let grammars = self.grammars.get_or_init(|| {
            Grammars::new(
                Arc::clone(&self.tokenizer),
                self.config().vocab_size,
                &self.eos_ids,
            )
            .map_err(|e| e.to_string())
        });
        grammars
            .as_ref()
            .map_err(|e| RuntimeError::Request(e.clone()))
    }

    pub fn config(&self) -> &ModelConfig {
        self.backend.config()
    }

    /// A fresh session on the model's backend.
    pub fn new_session(&self) -> Result<BackendSession> {
        self.backend.new_session()
    }

    /// The most tokens a sequence can hold (`max_position_embeddings`).
    fn context(&self) -> usize {
        self.config().max_position_embeddings
    }

    /// Renders and tokenizes a prompt. Tokenizing stops once the prompt has more tokens
    /// than the context holds ([`TextError::TooManyTokens`]), so a huge prompt costs about
    /// what a context's worth of text does.
    ///
    /// A prompt with no tokens (empty text or ids) is refused with [`RuntimeError::EmptyPrompt`].
    pub fn prepare(&self, prompt: &Prompt) -> Result<PreparedPrompt> {
        self.prepare_cancellable(prompt, &Cancel::default())
    }

    /// [`Model::prepare`] for a request that may go away: once `cancel` is cancelled, a chat
    /// template still rendering is stopped (its worker process killed) and the result is
    /// [`spindle_text::TextError::Cancelled`].
    pub fn prepare_cancellable(&self, prompt: &Prompt, cancel: &Cancel) -> Result<PreparedPrompt> {
        let text = match prompt {
            Prompt::Tokens(ids) if ids.is_empty() => return Err(RuntimeError::EmptyPrompt),
            Prompt::Tokens(ids) => {
                return Ok(PreparedPrompt {
                    text: String::new(),
                    ids: ids.clone(),
                    starts_in_reasoning: false,
                })
            }
            Prompt::Text {
                text,
                special_tokens,
            } => {
                let ids = self
                    .tokenizer
                    .encode_within(text, *special_tokens, self.context())?;
                if ids.is_empty() {
                    return Err(RuntimeError::EmptyPrompt);
                }
                return Ok(PreparedPrompt {
                    ids,
                    starts_in_reasoning: ends_in_open_think(text),
                    text: text.clone(),
                });
            }
            Prompt::Chat {
                messages,
                tools,
                vars,
                add_generation_prompt,
            } => {
                let started = std::time::Instant::now();
                let template = self.template.as_ref().ok_or_else(|| RuntimeError::File {
                    path: self.dir.clone(),
                    message: "no chat template (chat_template.jinja or tokenizer_config.json); use a raw prompt".into(),
                })?;
                let text = template.render_prompt_cancellable(
                    messages,
                    tools.as_ref(),
                    *add_generation_prompt,
                    vars,
                    &self.tokenizer.special_spellings(),
                    cancel,
                )?;
                tracing::debug!(elapsed = ?started.elapsed(), bytes = text.text.len(), "chat template rendered");
                text
            }
        };
        // Message text is plain: only the template's own markers become special tokens.
        let started = std::time::Instant::now();
        let ids = self.tokenizer.encode_prompt_within(&text, self.context())?;
        tracing::debug!(elapsed = ?started.elapsed(), tokens = ids.len(), "prompt tokenized");
        if ids.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        Ok(PreparedPrompt {
            starts_in_reasoning: ends_in_open_think(&text.text),
            text: text.text,
            ids,
        })
    }
}

/// Refuses a tokenizer that can produce ids the model has no embedding row for: every text
/// prompt holding such a token would fail later, mid-request. Released Qwen checkpoints pad
/// `vocab_size` above the tokenizer (248077 ids in 248320 rows), so this never refuses them.
fn check_tokenizer_fits(tokenizer: &Tokenizer, vocab_size: usize) -> Result<()> {
    let ids = tokenizer.id_limit();
    if ids > vocab_size {
        return Err(RuntimeError::File {
            path: tokenizer.path().to_path_buf(),
            message: format!(
                "the tokenizer has {ids} ids but config.json's vocab_size is {vocab_size}: \
                 ids {vocab_size}..{ids} have no embedding row (tokenizer and weights do not belong together)"
            ),
        });
    }
    Ok(())
}

/// True when the last `<think>` of the final turn has no `</think>` after it.
pub fn ends_in_open_think(text: &str) -> bool {
    let turn = text.rfind("<|im_start|>").map_or(text, |i| &text[i..]);
    match (turn.rfind("<think>"), turn.rfind("</think>")) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

struct GenerationConfig {
    values: GenerationConfigValues,
    eos_ids: Vec<u32>,
}

fn read_generation_config(dir: &Path) -> Result<GenerationConfig> {
    let path = dir.join("generation_config.json");
    if !path.exists() {
        return Ok(GenerationConfig {
            values: GenerationConfigValues::default(),
            eos_ids: Vec::new(),
        });
    }
    // Bounded, and a FIFO or device is refused rather than read (a real file is < 1 KB).
    let text = spindle_text::read_bounded_text(&path, 1 << 20)?;
    let bad = |message: String| RuntimeError::File {
        path: path.clone(),
        message,
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let f = |k: &str| v.get(k).and_then(Value::as_f64).map(|x| x as f32);
    let values = GenerationConfigValues {
        do_sample: v.get("do_sample").and_then(Value::as_bool),
        temperature: f("temperature"),
        top_k: v.get("top_k").and_then(Value::as_i64),
        top_p: f("top_p"),
        min_p: f("min_p"),
        repetition_penalty: f("repetition_penalty"),
        presence_penalty: f("presence_penalty"),
        frequency_penalty: f("frequency_penalty"),
    };
    let eos_ids = match v.get("eos_token_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|n| n as u32)
                    .ok_or_else(|| bad(format!("eos_token_id entry {x} is not a token id")))
            })
            .collect::<Result<_>>()?,
        Some(x) => vec![x
            .as_u64()
            .ok_or_else(|| bad(format!("eos_token_id = {x} is not a token id")))?
            as u32],
    };
    Ok(GenerationConfig { values, eos_ids })
}

#[cfg(test)]
mod tests {
    use super::ends_in_open_think;

    #[test]
    fn open_think_detection() {
        assert!(ends_in_open_think("<|im_start|>assistant\n<think>\n"));
        assert!(!ends_in_open_think(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!ends_in_open_think(
            "<think>a</think><|im_start|>assistant\n"
        ));
    }
}

/// The tokenizer of `dir`'s `tokenizer.json`, or the one a GGUF file's metadata carries.
pub fn load_tokenizer(dir: &Path) -> Result<Tokenizer> {
    if !spindle_model::gguf::is_gguf(dir) {
        return Ok(Tokenizer::from_dir(dir)?);
    }
    let json = spindle_model::gguf::open_tokenizer_json(dir)
        .map_err(spindle_cpu::EngineError::from)?
        .ok_or_else(|| TextError::TokenizerLoad {
            path: dir.to_owned(),
            message: "the GGUF file carries no tokenizer (no tokenizer.ggml.model key)".into(),
        })?;
    Ok(Tokenizer::from_json_bytes(json.as_bytes(), dir)?)
}

/// The chat template of `dir`, or the one a GGUF file's metadata carries.
pub fn load_chat_template(dir: &Path) -> std::result::Result<ChatTemplate, TextError> {
    if !spindle_model::gguf::is_gguf(dir) {
        return ChatTemplate::from_dir(dir);
    }
    match spindle_model::gguf::open_chat_template(dir) {
        Ok(Some(source)) => ChatTemplate::from_source(&source),
        Ok(None) => Err(TextError::NoChatTemplate {
            dir: dir.to_owned(),
        }),
        Err(e) => Err(TextError::TokenizerLoad {
            path: dir.to_owned(),
            message: e.to_string(),
        }),
    }
}
