//! Stop conditions: EOS tokens, stop strings and a token budget, applied to a token stream.
//!
//! Stop strings are matched on text, not tokens, so one can span token boundaries. Text that
//! could still be the start of a stop string is held back until it either completes the stop
//! string (then it is dropped and generation ends) or can no longer match (then it is
//! emitted). The stop string itself is never emitted.

use std::sync::Arc;

use crate::{Detokenizer, TextError, Tokenizer};

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// One of the end-of-sequence ids was generated.
    Eos(u32),
    /// A stop string appeared in the text; it holds that stop string.
    StopString(String),
    /// The token budget was used up.
    MaxTokens,
}

/// When to end a generation.
#[derive(Debug, Clone, Default)]
pub struct StopConditions {
    /// Token ids that end generation (`generation_config.eos_token_id`, `<|im_end|>`).
    pub eos_ids: Vec<u32>,
    /// Texts that end generation; empty strings are ignored.
    pub stop_strings: Vec<String>,
    /// The most tokens to generate; `None` for no limit.
    pub max_tokens: Option<usize>,
}

/// Matches stop strings in a stream of text deltas.
#[derive(Debug, Clone)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not emitted: a suffix that may be the start of a stop string.
    held: String,
}

/// What [`StopStrings::push`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopScan {
    /// Text safe to emit.
    pub text: String,
    /// The stop string that matched, if one did; `text` ends just before it.
    pub matched: Option<String>,
}

impl StopStrings {
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds a delta; returns the text that can no longer be part of a stop string, or the text
    /// before the earliest stop string if one completed (everything after it is dropped).
    pub fn push(&mut self, delta: &str) -> StopScan {
        self.held.push_str(delta);
        let earliest = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()).map(|at| (at, stop)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = earliest {
            let stop = stop.clone();
            self.held.truncate(at);
            return StopScan {
                text: std::mem::take(&mut self.held),
                matched: Some(stop),
            };
        }
        let keep = partial_match_len(&self.held, &self.stops);
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        StopScan {
            text,
            matched: None,
        }
    }

    /// Emits the held-back text: the stream ended without completing a stop string.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length in bytes of the longest suffix of `text` that is a proper prefix of one of `patterns`
/// (0 if none). The suffix always starts on a character boundary.
pub(crate) fn partial_match_len<S: AsRef<str>>(text: &str, patterns: &[S]) -> usize {
    let longest = patterns.iter().map(|p| p.as_ref().len()).max().unwrap_or(0);
    let earliest = text.len().saturating_sub(longest.saturating_sub(1));
    text.char_indices()
        .map(|(i, _)| i)
        .filter(|&i| i >= earliest)
        .find(|&i| {
            let tail = &text[i..];
            patterns
                .iter()
                .any(|p| p.as_ref().len() > tail.len() && p.as_ref().starts_with(tail))
        })
        .map_or(0, |i| text.len() - i)
}

/// One step of a [`TextStream`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamDelta {
    /// Text to show now (may be empty).
    pub text: String,
    /// Set on the step that ended the generation.
    pub finished: Option<FinishReason>,
}

/// A detokenizer with stop conditions: the text side of a decode loop.
#[derive(Debug)]
pub struct TextStream {
    detokenizer: Detokenizer,
    stops: StopStrings,
    eos_ids: Vec<u32>,
    max_tokens: Option<usize>,
    /// Stop strings are not matched in the text of the first `min_tokens` tokens.
    min_tokens: usize,
    generated: usize,
    finished: Option<FinishReason>,
}

impl TextStream {
    /// A stream that hides control tokens ([`Tokenizer::control_ids`]) and keeps reasoning and
    /// tool-call tags in the text for the output parser.
    pub fn new(tokenizer: Arc<Tokenizer>, conditions: &StopConditions) -> Self {
        let hidden = tokenizer.control_ids();
        Self {
            detokenizer: Detokenizer::new(tokenizer, &hidden),
            stops: StopStrings::new(&conditions.stop_strings),
            eos_ids: conditions.eos_ids.clone(),
            max_tokens: conditions.max_tokens,
            min_tokens: 0,
            generated: 0,
            finished: None,
        }
    }

    /// The stream with stop strings ignored in the text of the first `min_tokens` tokens (as
    /// vLLM's `min_tokens`: a stop string there neither ends generation nor is cut from the
    /// text; it is matched only in text that comes after them).
    pub fn with_min_tokens(mut self, min_tokens: usize) -> Self {
        self.min_tokens = min_tokens;
        self
    }

    /// Why the stream ended, once it has.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.finished.as_ref()
    }

    /// Number of tokens pushed so far (EOS included).
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Adds one generated token. After the stream has finished, further tokens are ignored.
    pub fn push(&mut self, id: u32) -> Result<StreamDelta, TextError> {
        if let Some(reason) = &self.finished {
            return Ok(StreamDelta {
                text: String::new(),
                finished: Some(reason.clone()),
            });
        }
        self.generated += 1;
        if self.eos_ids.contains(&id) {
            return self.end(String::new(), FinishReason::Eos(id));
        }
        let delta = self.detokenizer.push(id)?;
        let scan = if self.generated <= self.min_tokens {
            StopScan {
                text: delta,
                matched: None,
            }
        } else {
            self.stops.push(&delta)
        };
        if let Some(stop) = scan.matched {
            return Ok(self.finish_with(scan.text, FinishReason::StopString(stop)));
        }
        if self.max_tokens.is_some_and(|max| self.generated >= max) {
            return self.end(scan.text, FinishReason::MaxTokens);
        }
        Ok(StreamDelta {
            text: scan.text,
            finished: None,
        })
    }

    /// Ends the stream from outside (cancelled, context full): emits what is held back.
    /// Returns the final text; `reason` is recorded unless a stop string matches in it.
    pub fn finish(&mut self, reason: FinishReason) -> Result<StreamDelta, TextError> {
        if let Some(done) = &self.finished {
            return Ok(StreamDelta {
                text: String::new(),
                finished: Some(done.clone()),
            });
        }
        self.end(String::new(), reason)
    }

    /// Flushes the detokenizer and the stop matcher after `text`, then finishes.
    fn end(&mut self, mut text: String, reason: FinishReason) -> Result<StreamDelta, TextError> {
        let rest = self.detokenizer.flush()?;
        let scan = self.stops.push(&rest);
        text.push_str(&scan.text);
        if let Some(stop) = scan.matched {
            return Ok(self.finish_with(text, FinishReason::StopString(stop)));
        }
        text.push_str(&self.stops.flush());
        Ok(self.finish_with(text, reason))
    }

    fn finish_with(&mut self, text: String, reason: FinishReason) -> StreamDelta {
        self.finished = Some(reason.clone());
        StreamDelta {
            text,
            finished: Some(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (String, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut matcher = StopStrings::new(&stops);
        let mut out = String::new();
        for delta in deltas {
            let scan = matcher.push(delta);
            out.push_str(&scan.text);
            if scan.matched.is_some() {
                return (out, scan.matched);
            }
        }
        out.push_str(&matcher.flush());
        (out, None)
    }

    #[test]
    fn stop_string_across_deltas_is_cut_and_not_emitted() {
        let (text, stop) = run(&["STOP"], &["abc S", "T", "OP tail"]);
        assert_eq!(text, "abc ");
        assert_eq!(stop.as_deref(), Some("STOP"));
    }

    #[test]
    fn possible_prefix_is_held_then_released() {
        let mut matcher = StopStrings::new(&["</end>".to_string()]);
        assert_eq!(matcher.push("x </e").text, "x ");
        assert_eq!(matcher.push("nx").text, "</enx");
        assert_eq!(matcher.flush(), "");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (text, stop) = run(&["world", "lo w"], &["hello world"]);
        assert_eq!(text, "hel");
        assert_eq!(stop.as_deref(), Some("lo w"));
    }

    #[test]
    fn held_text_respects_char_boundaries() {
        // "é" is two bytes; the stop begins with it.
        let (text, stop) = run(&["éé!"], &["aé", "é", "?"]);
        assert_eq!(text, "aéé?");
        assert_eq!(stop, None);
        assert_eq!(partial_match_len("aé", &["éx"]), "é".len());
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let (text, stop) = run(&[""], &["abc"]);
        assert_eq!((text.as_str(), stop), ("abc", None));
    }
}
