//! Streaming detokenization: token ids in one at a time, text deltas out.
//!
//! A byte-level BPE token can end in the middle of a multi-byte UTF-8 character (an emoji is
//! often three or four tokens). Decoding each token alone would print U+FFFD; instead the
//! detokenizer decodes a short window of recent tokens and emits only text that is complete:
//! while the window's text ends in U+FFFD, the bytes are held until the next token completes
//! them. This is the prefix/read-offset scheme of Hugging Face's `DecodeStream` and vLLM.

use std::sync::Arc;

use crate::{TextError, Tokenizer};

/// Turns a stream of token ids into a stream of UTF-8 text deltas.
#[derive(Debug)]
pub struct Detokenizer {
    tokenizer: Arc<Tokenizer>,
    /// Ids that produce no text (control tokens such as `<|im_end|>`), sorted.
    hidden: Vec<u32>,
    /// Ids not yet dropped: `ids[prefix..read]` is the context of the last emitted text,
    /// `ids[read..]` the tokens whose text is still held back.
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl Detokenizer {
    /// A detokenizer that emits the text of every token except those in `hidden`
    /// ([`Tokenizer::control_ids`] hides control tokens but keeps `<think>`/`<tool_call>`).
    pub fn new(tokenizer: Arc<Tokenizer>, hidden: &[u32]) -> Self {
        let mut hidden = hidden.to_vec();
        hidden.sort_unstable();
        hidden.dedup();
        Self {
            tokenizer,
            hidden,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// Adds one token; returns the text that became complete (often empty).
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        if self.hidden.binary_search(&id).is_ok() {
            return Ok(String::new());
        }
        self.ids.push(id);
        let shown = self.decode(self.prefix, self.read)?;
        let all = self.decode(self.prefix, self.ids.len())?;
        if all.len() <= shown.len() || all.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let delta = new_suffix(&shown, all);
        self.prefix = self.read;
        self.read = self.ids.len();
        self.forget_old_context();
        Ok(delta)
    }

    /// Emits whatever is still held back (an incomplete character becomes U+FFFD) and starts
    /// afresh. Call at the end of a generation.
    pub fn flush(&mut self) -> Result<String, TextError> {
        let shown = self.decode(self.prefix, self.read)?;
        let all = self.decode(self.prefix, self.ids.len())?;
        let delta = if all.len() > shown.len() {
            new_suffix(&shown, all)
        } else {
            String::new()
        };
        self.ids.clear();
        self.prefix = 0;
        self.read = 0;
        Ok(delta)
    }

    fn decode(&self, from: usize, to: usize) -> Result<String, TextError> {
        match self.ids.get(from..to) {
            Some(ids) if !ids.is_empty() => self.tokenizer.decode(ids, false),
            _ => Ok(String::new()),
        }
    }

    /// Drops ids before the context window so a long generation does not grow `ids`.
    fn forget_old_context(&mut self) {
        if self.prefix > 0 {
            self.ids.drain(..self.prefix);
            self.read -= self.prefix;
            self.prefix = 0;
        }
    }
}

/// The part of `all` after `shown`. Byte-level decoding of a longer window extends the shorter
/// one's text; if a decoder ever rewrote earlier text, the whole new text is returned rather
/// than a slice cut at a wrong place.
fn new_suffix(shown: &str, all: String) -> String {
    match all.strip_prefix(shown) {
        Some(rest) => rest.to_string(),
        None => {
            tracing::warn!(
                shown,
                all,
                "detokenizer window text does not extend its prefix"
            );
            all
        }
    }
}
