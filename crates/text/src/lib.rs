//! Text in, text out: everything between a user's words and token ids.
//!
//! - [`Tokenizer`]: Hugging Face `tokenizer.json` (byte-level BPE + special tokens).
//! - [`ChatTemplate`]: the checkpoint's Jinja chat template, rendered exactly as transformers
//!   renders it.
//! - [`Detokenizer`]: token ids to text deltas that never split a UTF-8 character.
//! - [`TextStream`], [`StopConditions`]: the detokenizer plus EOS ids, stop strings and a token
//!   budget, for a decode loop.
//! - [`OutputParser`], [`parse_output`]: reasoning, answer and tool calls from generated text,
//!   incrementally or all at once.
//!
//! Nothing here touches tensors; the engine hands this crate token ids and takes ids back.

mod chat_template;
mod detokenizer;
mod error;
mod json;
mod memo;
mod parse;
mod pieces;
mod prompt;
mod read;
mod sandbox;
mod stop;
mod tag_size;
mod tokenizer;

pub use chat_template::{ChatTemplate, MAX_RENDERED_BYTES, RENDER_FUEL};
pub use detokenizer::Detokenizer;
pub use error::TextError;
pub use parse::{parse_output, OutputParser, ParseEvent, ParsedOutput, ToolCall};
pub use prompt::PromptText;
pub use read::{
    read_bounded, read_bounded_text, MAX_TEMPLATE_BYTES, MAX_TOKENIZER_BYTES,
    MAX_TOKENIZER_CONFIG_BYTES,
};
pub use sandbox::{Cancel, CancelOnDrop, RENDER_MEMORY_BYTES, RENDER_TIME_LIMIT};
pub use stop::{FinishReason, StopConditions, StopScan, StopStrings, StreamDelta, TextStream};
pub use tokenizer::Tokenizer;
