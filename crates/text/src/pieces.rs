//! Cutting long text into pieces that tokenize exactly as the whole does.
//!
//! The `tokenizers` library spends a few hundred bytes of bookkeeping per input byte (offsets,
//! alignments, token strings), so a 4 MB message costs about a gigabyte when encoded whole.
//! Encoded in pieces of [`PIECE_BYTES`], it costs that of one piece, and a caller that needs
//! only so many tokens can stop early.
//!
//! A cut is exact when every stage of the pipeline would split there anyway and nothing on
//! one side looks at the other. For the Qwen tokenizer (no normalizer or NFC; the regex
//! [`QWEN_SPLIT`] in `Isolated` mode, then byte-level; BPE inside each regex match) a cut at
//! byte `p` is exact when
//! - `text[p - 1]` is `\n` and `text[p]` is not white space: the match holding the `\n` is
//!   `\s*[\r\n]+` (or punctuation followed by `[\r\n]*`), which ends at `p`; no alternative
//!   takes a `\n` and then more; or
//! - `text[p]` is a space and `text[p - 1]` is not white space: the match holding `text[p-1]`
//!   is a letter run, a single digit, a contraction or a punctuation run, none of which takes
//!   a following space.
//!
//! In both cases no match before `p` looks past it (the only look-ahead, `\s+(?!\S)`, ends a
//! white-space run, and none ends at `p`), the text after `p` is matched from `p` exactly as
//! in the whole, NFC leaves an ASCII starter where it is, and no added token spans `p` (they
//! are required to hold no white space and not to strip or match single words).

use tokenizers::{ModelWrapper, NormalizerWrapper, Tokenizer};

/// The pre-tokenizer regex of Qwen2 through Qwen3.6 (`tokenizer.json`, `Split`).
pub(crate) const QWEN_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The bytes after which a piece ends at the next exact cut.
pub(crate) const PIECE_BYTES: usize = 32 << 10;

/// Whether `tokenizer` is one the cuts above are proven for: BPE without dropout, no
/// normalizer or NFC, the pre-tokenizer `Sequence[Split(QWEN_SPLIT, Isolated),
/// ByteLevel(use_regex = false)]`, and added tokens without white space or strip options.
pub(crate) fn splits_like_qwen(tokenizer: &Tokenizer) -> bool {
    let bpe = matches!(tokenizer.get_model(), ModelWrapper::BPE(bpe) if bpe.dropout.is_none());
    let normalizer = matches!(
        tokenizer.get_normalizer(),
        None | Some(NormalizerWrapper::NFC(_))
    );
    let pre = tokenizer
        .get_pre_tokenizer()
        .and_then(|p| serde_json::to_value(p).ok());
    let pre = pre.as_ref().is_some_and(|p| {
        let parts = p["pretokenizers"].as_array();
        p["type"] == "Sequence"
            && parts.is_some_and(|parts| {
                parts.len() == 2
                    && parts[0]["type"] == "Split"
                    && parts[0]["pattern"]["Regex"] == QWEN_SPLIT
                    && parts[0]["behavior"] == "Isolated"
                    && parts[0]["invert"] == false
                    && parts[1]["type"] == "ByteLevel"
                    && parts[1]["add_prefix_space"] == false
                    && parts[1]["use_regex"] == false
            })
    });
    let added = tokenizer.get_added_tokens_decoder().values().all(|t| {
        !t.content.chars().any(char::is_whitespace) && !t.lstrip && !t.rstrip && !t.single_word
    });
    bpe && normalizer && pre && added
}

/// The pieces of a text: each about [`PIECE_BYTES`] long (or the step given; longer when no
/// exact cut comes sooner), together the whole text.
pub(crate) struct Pieces<'a> {
    rest: &'a str,
    step: usize,
}

impl<'a> Pieces<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self::with_step(text, PIECE_BYTES)
    }

    /// Pieces of about `step` bytes.
    pub(crate) fn with_step(text: &'a str, step: usize) -> Self {
        Pieces { rest: text, step }
    }
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.rest.is_empty() {
            return None;
        }
        let end = next_cut(self.rest, self.step).unwrap_or(self.rest.len());
        let (piece, rest) = self.rest.split_at(end);
        self.rest = rest;
        Some(piece)
    }
}

/// The first exact cut at or after byte `from` (see the module docs).
pub(crate) fn next_cut(text: &str, from: usize) -> Option<usize> {
    (from.max(1)..text.len()).find(|&p| is_cut(text, p))
}

/// Whether byte `p` of `text` is an exact cut (see the module docs); false at either end.
pub(crate) fn is_cut(text: &str, p: usize) -> bool {
    let bytes = text.as_bytes();
    if p == 0 || p >= bytes.len() {
        return false;
    }
    // Only ASCII bytes are looked at, so `p` is always a char boundary when it matches.
    let (before, at) = (bytes[p - 1], bytes[p]);
    let newline_cut = before == b'\n' && !is_space_at(text, p);
    let space_cut = at == b' ' && !is_space_before(text, p);
    newline_cut || space_cut
}

/// Whether the char starting at byte `p` is white space (false inside a char).
fn is_space_at(text: &str, p: usize) -> bool {
    text.is_char_boundary(p) && text[p..].chars().next().is_some_and(char::is_whitespace)
}

/// Whether the char ending at byte `p` (a char boundary) is white space.
fn is_space_before(text: &str, p: usize) -> bool {
    text.is_char_boundary(p)
        && text[..p]
            .chars()
            .next_back()
            .is_some_and(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_only_where_the_regex_splits_anyway() {
        assert_eq!(next_cut("ab cd", 0), Some(2));
        assert_eq!(
            next_cut("ab  cd", 0),
            Some(2),
            "before the first space of a run"
        );
        assert_eq!(next_cut("  cd", 0), None, "a space after a space is no cut");
        assert_eq!(next_cut("a\nb", 0), Some(2));
        assert_eq!(next_cut("a\n\nb", 0), Some(3));
        assert_eq!(next_cut("a\n b", 0), None, "white space after the newline");
        assert_eq!(next_cut("é b", 0), Some(2));
        assert_eq!(next_cut("中文 b", 0), Some(6));
        let text = "word ".repeat(10_000);
        let pieces: Vec<&str> = Pieces::new(&text).collect();
        assert!(pieces.len() > 1);
        assert_eq!(pieces.concat(), text);
    }
}
