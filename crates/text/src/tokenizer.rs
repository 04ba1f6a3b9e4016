//! The tokenizer: Hugging Face `tokenizer.json` loaded with the `tokenizers` library.
//!
//! Qwen checkpoints ship a byte-level BPE tokenizer with special tokens (`<|im_start|>`,
//! `<think>`, ...) registered as added tokens. Text can be encoded with special tokens
//! recognised (a rendered chat prompt) or with their spellings treated as plain text
//! (untrusted user text that must not inject control tokens).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::memo::{self, Memo};
use crate::pieces;
use crate::read::{read_bounded, MAX_TOKENIZER_BYTES};

use crate::{PromptText, TextError};

/// A loaded `tokenizer.json`.
pub struct Tokenizer {
    /// Splits on added tokens: `<|im_end|>` in the input becomes one special token.
    inner: tokenizers::Tokenizer,
    /// A copy that encodes special tokens' spellings as ordinary text, made on first use.
    plain: OnceLock<tokenizers::Tokenizer>,
    /// Ids of the added tokens marked `special`, sorted.
    special_ids: Vec<u32>,
    /// Text may be encoded piece by piece, cut where the pre-tokenizer splits anyway
    /// (`crate::pieces`): the Qwen byte-level BPE with its regex.
    piecewise: bool,
    /// Recently encoded long texts (piecewise tokenizers only): a text that starts like one of
    /// them encodes only the rest (`crate::memo`).
    memo: Memo,
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` from a model directory.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, TextError> {
        Self::from_file(dir.as_ref().join("tokenizer.json"))
    }

    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TextError> {
        let path = path.as_ref().to_path_buf();
        let bytes = read_bounded(&path, MAX_TOKENIZER_BYTES)?;
        Self::from_json_bytes(&bytes, path)
    }

    /// Loads `tokenizer.json` text held in memory (one rebuilt from a GGUF file's metadata);
    /// `path` names its origin in messages.
    pub fn from_json_bytes(bytes: &[u8], path: impl AsRef<Path>) -> Result<Self, TextError> {
        let path = path.as_ref().to_path_buf();
        let refused = |message: String| TextError::TokenizerLoad {
            path: path.clone(),
            message,
        };
        // The `tokenizers` library panics on some malformed JSON (a document cut short inside
        // a pre-tokenizer): the syntax is checked first.
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
            .map_err(|e| refused(format!("not valid JSON: {e}")))?;
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| refused(e.to_string()))?;
        let mut special_ids: Vec<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        special_ids.sort_unstable();
        let piecewise = pieces::splits_like_qwen(&inner);
        tracing::debug!(
            path = %path.display(),
            vocab = inner.get_vocab_size(true),
            special = special_ids.len(),
            piecewise,
            "loaded tokenizer"
        );
        Ok(Self {
            inner,
            plain: OnceLock::new(),
            special_ids,
            piecewise,
            memo: Memo::default(),
            path,
        })
    }

    /// The tokenizer as `tokenizer.json` text, as the `tokenizers` library writes it: for
    /// readers of that format (the grammar engine's token trie), also when the tokenizer was
    /// rebuilt from a GGUF file and [`Tokenizer::path`] is no JSON file.
    pub fn to_json(&self) -> Result<String, TextError> {
        self.inner
            .to_string(false)
            .map_err(|e| TextError::Tokenizer {
                operation: "write tokenizer.json",
                message: e.to_string(),
            })
    }

    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of ids, added tokens included (`max id + 1` for contiguous vocabularies).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encodes `text` without adding BOS/EOS. With `allow_special`, the spelling of a special
    /// token (`<|im_start|>`) becomes that token; without it, it is encoded as plain text.
    pub fn encode(&self, text: &str, allow_special: bool) -> Result<Vec<u32>, TextError> {
        let mut ids = Vec::new();
        self.encode_into(&mut ids, text, allow_special, usize::MAX)?;
        Ok(ids)
    }

    /// [`Tokenizer::encode`] that stops once more than `max_tokens` ids are out:
    /// [`TextError::TooManyTokens`]. Long text is encoded in pieces (see `crate::pieces`),
    /// so its cost stays that of a piece, and a text far over the limit is refused after
    /// the first `max_tokens` or so.
    pub fn encode_within(
        &self,
        text: &str,
        allow_special: bool,
        max_tokens: usize,
    ) -> Result<Vec<u32>, TextError> {
        let mut ids = Vec::new();
        self.encode_into(&mut ids, text, allow_special, max_tokens)?;
        Ok(ids)
    }

    /// Encodes a rendered chat prompt: the template's text with special tokens recognised,
    /// the caller's text that spells special tokens ([`PromptText::plain`]) as plain text.
    /// A prompt without plain ranges encodes exactly as `encode(text, true)`.
    pub fn encode_prompt(&self, prompt: &PromptText) -> Result<Vec<u32>, TextError> {
        self.encode_prompt_within(prompt, usize::MAX)
    }

    /// [`Tokenizer::encode_prompt`] that stops with [`TextError::TooManyTokens`] once more
    /// than `max_tokens` ids are out.
    pub fn encode_prompt_within(
        &self,
        prompt: &PromptText,
        max_tokens: usize,
    ) -> Result<Vec<u32>, TextError> {
        let mut ids = Vec::new();
        for (segment, allow_special) in prompt.segments() {
            self.encode_into(&mut ids, segment, allow_special, max_tokens)?;
        }
        Ok(ids)
    }

    /// Appends the ids of `text` to `ids`, piece by piece where that is exact.
    fn encode_into(
        &self,
        ids: &mut Vec<u32>,
        text: &str,
        allow_special: bool,
        max_tokens: usize,
    ) -> Result<(), TextError> {
        let tokenizer = if allow_special {
            &self.inner
        } else {
            self.plain.get_or_init(|| {
                let mut plain = self.inner.clone();
                plain.set_encode_special_tokens(true);
                plain
            })
        };
        let encode = |ids: &mut Vec<u32>, piece: &str| -> Result<(), TextError> {
            let encoding = tokenizer
                .encode(piece, false)
                .map_err(|e| TextError::Tokenizer {
                    operation: "encode",
                    message: e.to_string(),
                })?;
            ids.extend_from_slice(encoding.get_ids());
            if ids.len() > max_tokens {
                return Err(TextError::TooManyTokens {
                    counted: ids.len(),
                    limit: max_tokens,
                });
            }
            Ok(())
        };
        if !self.piecewise {
            return encode(ids, text);
        }
        if text.len() < memo::MIN_BYTES {
            return pieces::Pieces::new(text).try_for_each(|piece| encode(ids, piece));
        }
        // Long text: resume after the longest beginning a recent text shares, and record this
        // text's cuts for the next.
        let first = ids.len();
        let (mut at, mut cuts) = match self.memo.resume(text, allow_special) {
            Some(resume) => {
                ids.extend_from_slice(&resume.ids);
                if ids.len() > max_tokens {
                    return Err(TextError::TooManyTokens {
                        counted: ids.len(),
                        limit: max_tokens,
                    });
                }
                (resume.at, resume.cuts)
            }
            None => (0, Vec::new()),
        };
        for piece in pieces::Pieces::with_step(&text[at..], memo::STEP_BYTES) {
            if at > 0 && cuts.last().is_none_or(|&(p, _)| p != at) {
                cuts.push((at, ids.len() - first));
            }
            encode(ids, piece)?;
            at += piece.len();
        }
        self.memo
            .keep(text, allow_special, ids[first..].to_vec(), cuts);
        Ok(())
    }

    /// Bytes of text whose ids were taken from a recently encoded text that starts the same
    /// way, instead of encoded again (a diagnostic; see `memo.rs`).
    pub fn memo_skipped_bytes(&self) -> usize {
        self.memo.skipped_bytes()
    }

    /// The spellings of the special tokens, for [`crate::ChatTemplate::render_prompt`].
    pub fn special_spellings(&self) -> Vec<String> {
        self.special_ids
            .iter()
            .filter_map(|&id| self.inner.id_to_token(id))
            .collect()
    }

    /// One more than the largest id the tokenizer can produce (added tokens included), the
    /// least vocabulary size a model needs to embed every id.
    pub fn id_limit(&self) -> usize {
        let added = self
            .inner
            .get_added_tokens_decoder()
            .keys()
            .max()
            .map_or(0, |&m| m as usize + 1);
        self.inner.get_vocab_size(false).max(added)
    }

    /// Decodes ids to text; with `skip_special`, special tokens contribute nothing.
    /// Bytes that do not form valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TextError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TextError::Tokenizer {
                operation: "decode",
                message: e.to_string(),
            })
    }

    /// The vocabulary entry of `id` as stored (byte-level pieces spell a space as `Ġ`).
    pub fn id_to_piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a vocabulary entry or added token spelled exactly `token`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Ids of the added tokens marked special, sorted.
    pub fn special_ids(&self) -> &[u32] {
        &self.special_ids
    }

    /// Whether `id` is an added token marked special.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.binary_search(&id).is_ok()
    }

    /// Special tokens that are control tokens rather than output markup: every special id
    /// except the reasoning and tool-call tags (`<think>`, `</think>`, `<tool_call>`,
    /// `</tool_call>`), which the output parser needs to see in the decoded text.
    pub fn control_ids(&self) -> Vec<u32> {
        let markup: Vec<u32> = crate::parse::MARKUP_TAGS
            .iter()
            .filter_map(|tag| self.token_to_id(tag))
            .collect();
        self.special_ids
            .iter()
            .copied()
            .filter(|id| !markup.contains(id))
            .collect()
    }
}
