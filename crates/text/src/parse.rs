//! Output parsing: reasoning (`<think>…</think>`), answer text and Qwen XML tool calls, from a
//! finished text or incrementally from a stream of text deltas.
//!
//! A tool call as Qwen3.5/3.6 write it (and as their chat templates render it back):
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//! A parameter value loses one leading and one trailing newline, then is taken as JSON when it
//! parses as JSON (`21`, `true`, `{"a": 1}`) and as a string otherwise.
//!
//! Whitespace is normalised the way the templates render a turn: reasoning and the answer are
//! trimmed, and whitespace next to tags is dropped. The streaming parser holds back trailing
//! whitespace and anything that may be the start of a tag, so it never emits a partial tag and
//! gives the same result whether fed all at once or one character at a time.

use serde_json::{Map as JsonMap, Value as Json};

use crate::stop::partial_match_len;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";

/// The tags the parser reads; a detokenizer must not hide their tokens.
pub(crate) const MARKUP_TAGS: [&str; 4] = [THINK_OPEN, THINK_CLOSE, TOOL_OPEN, TOOL_CLOSE];

/// One parsed tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The parameters in the order written.
    pub arguments: JsonMap<String, Json>,
}

impl ToolCall {
    /// The arguments as a compact JSON string (OpenAI's `function.arguments`).
    pub fn arguments_json(&self) -> String {
        Json::Object(self.arguments.clone()).to_string()
    }
}

/// What the streaming parser reports.
#[derive(Debug, Clone, PartialEq)]
pub enum ParseEvent {
    /// More reasoning text.
    Reasoning(String),
    /// More answer text.
    Content(String),
    /// A complete tool call.
    ToolCall(ToolCall),
}

/// A whole parsed turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedOutput {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

impl ParsedOutput {
    /// Accumulates one event.
    pub fn apply(&mut self, event: ParseEvent) {
        match event {
            ParseEvent::Reasoning(text) => self.reasoning.push_str(&text),
            ParseEvent::Content(text) => self.content.push_str(&text),
            ParseEvent::ToolCall(call) => self.tool_calls.push(call),
        }
    }
}

/// Parses a finished turn. `starts_in_reasoning`: the prompt ended in `<think>\n`, so the text
/// begins inside the reasoning and only a closing `</think>` appears.
pub fn parse_output(text: &str, starts_in_reasoning: bool) -> ParsedOutput {
    let mut parser = OutputParser::new(starts_in_reasoning);
    let mut out = ParsedOutput::default();
    parser
        .push(text)
        .into_iter()
        .chain(parser.finish())
        .for_each(|event| out.apply(event));
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace seen yet: a `<think>` here opens reasoning.
    Start,
    Reasoning,
    Content,
    /// Inside `<tool_call>`: the block is buffered until `</tool_call>`.
    ToolCall,
}

/// Splits a stream of text deltas into reasoning, answer and tool-call events.
#[derive(Debug, Clone)]
pub struct OutputParser {
    mode: Mode,
    /// Received text not yet classified (a possible partial tag, or an open tool call).
    buffer: String,
    /// Trailing whitespace of the current segment, emitted only if more text follows.
    pending_space: String,
    /// At the start of a segment, where leading whitespace is dropped.
    segment_start: bool,
}

impl OutputParser {
    pub fn new(starts_in_reasoning: bool) -> Self {
        Self {
            mode: if starts_in_reasoning {
                Mode::Reasoning
            } else {
                Mode::Start
            },
            buffer: String::new(),
            pending_space: String::new(),
            segment_start: true,
        }
    }

    /// Adds a text delta; returns the events it completes.
    pub fn push(&mut self, delta: &str) -> Vec<ParseEvent> {
        self.buffer.push_str(delta);
        let mut events = Vec::new();
        while self.step(&mut events) {}
        events
    }

    /// Ends the stream: held text is emitted as what it is (a partial tag as text, an
    /// unterminated tool call as a call if it parses, else as text).
    pub fn finish(&mut self) -> Vec<ParseEvent> {
        let mut events = Vec::new();
        let rest = std::mem::take(&mut self.buffer);
        match self.mode {
            Mode::Start | Mode::Content => self.emit(Mode::Content, &rest, &mut events),
            Mode::Reasoning => self.emit(Mode::Reasoning, &rest, &mut events),
            Mode::ToolCall => match parse_tool_call(&rest) {
                Some(call) => events.push(ParseEvent::ToolCall(call)),
                None => self.emit(Mode::Content, &format!("{TOOL_OPEN}{rest}"), &mut events),
            },
        }
        self.pending_space.clear();
        self.segment_start = true;
        events
    }

    /// Consumes what it can of the buffer; returns whether to go on.
    fn step(&mut self, events: &mut Vec<ParseEvent>) -> bool {
        match self.mode {
            Mode::Start => {
                let start = self.buffer.len() - self.buffer.trim_start().len();
                self.buffer.drain(..start);
                if self.buffer.starts_with(THINK_OPEN) {
                    self.buffer.drain(..THINK_OPEN.len());
                    self.enter(Mode::Reasoning);
                    true
                } else if self.buffer.is_empty() || THINK_OPEN.starts_with(self.buffer.as_str()) {
                    false
                } else {
                    self.mode = Mode::Content;
                    true
                }
            }
            Mode::Reasoning => self.scan_text(THINK_CLOSE, Mode::Content, events),
            Mode::Content => self.scan_text(TOOL_OPEN, Mode::ToolCall, events),
            Mode::ToolCall => {
                let Some(at) = self.buffer.find(TOOL_CLOSE) else {
                    return false;
                };
                let block: String = self.buffer.drain(..at + TOOL_CLOSE.len()).collect();
                let block = &block[..at];
                match parse_tool_call(block) {
                    Some(call) => {
                        events.push(ParseEvent::ToolCall(call));
                        self.enter(Mode::Content);
                    }
                    None => {
                        // Not a call: it is text, with the whitespace around it kept.
                        let raw = format!("{TOOL_OPEN}{block}{TOOL_CLOSE}");
                        self.emit(Mode::Content, &raw, events);
                        self.mode = Mode::Content;
                    }
                }
                true
            }
        }
    }

    /// In a text mode: emits text up to `tag` and switches to `next`, or emits all but a
    /// possible partial `tag` and waits.
    fn scan_text(&mut self, tag: &str, next: Mode, events: &mut Vec<ParseEvent>) -> bool {
        let mode = self.mode;
        if let Some(at) = self.buffer.find(tag) {
            let text: String = self.buffer.drain(..at + tag.len()).collect();
            self.emit(mode, &text[..at], events);
            if next == Mode::ToolCall {
                // Whitespace before the tag is dropped only once the block parses as a call.
                self.mode = next;
            } else {
                self.enter(next);
            }
            return true;
        }
        let keep = partial_match_len(&self.buffer, &[tag]);
        let text: String = self.buffer.drain(..self.buffer.len() - keep).collect();
        self.emit(mode, &text, events);
        false
    }

    /// Switches mode after a tag: whitespace before the tag is dropped, a new segment starts.
    fn enter(&mut self, mode: Mode) {
        self.mode = mode;
        self.pending_space.clear();
        self.segment_start = true;
    }

    /// Emits `text` as reasoning or content, trimming at segment edges.
    fn emit(&mut self, mode: Mode, text: &str, events: &mut Vec<ParseEvent>) {
        let mut text = text;
        if self.segment_start {
            text = text.trim_start();
            if text.is_empty() {
                return;
            }
            self.segment_start = false;
        }
        let body = text.trim_end();
        let trailing = &text[body.len()..];
        if !body.is_empty() {
            let out = std::mem::take(&mut self.pending_space) + body;
            events.push(match mode {
                Mode::Reasoning => ParseEvent::Reasoning(out),
                _ => ParseEvent::Content(out),
            });
        }
        self.pending_space.push_str(trailing);
    }
}

/// Parses the inside of a `<tool_call>` block; `None` when it is not a well-formed call.
fn parse_tool_call(block: &str) -> Option<ToolCall> {
    let rest = block.trim().strip_prefix("<function=")?;
    let (name, mut body) = rest.split_once('>')?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    if let Some((inner, after)) = body.split_once("</function>") {
        if !after.trim().is_empty() {
            return None;
        }
        body = inner;
    }
    let mut arguments = JsonMap::new();
    loop {
        body = body.trim_start();
        if body.is_empty() {
            break;
        }
        let rest = body.strip_prefix("<parameter=")?;
        let (param, rest) = rest.split_once('>')?;
        let (value, rest) = match rest.split_once("</parameter>") {
            Some(split) => split,
            // An unclosed parameter runs to the next one or to the end.
            None => match rest.find("<parameter=") {
                Some(at) => (&rest[..at], &rest[at..]),
                None => (rest, ""),
            },
        };
        arguments.insert(param.trim().to_string(), parameter_value(value));
        body = rest;
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// A parameter's text without its framing newlines, as JSON if it parses, else a string.
fn parameter_value(text: &str) -> Json {
    let text = text.strip_prefix('\n').unwrap_or(text);
    let text = text.strip_suffix('\n').unwrap_or(text);
    serde_json::from_str(text).unwrap_or_else(|_| Json::String(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Feeds `text` in pieces of `chunk` characters and accumulates the events.
    fn parse_in_chunks(text: &str, starts_in_reasoning: bool, chunk: usize) -> ParsedOutput {
        let mut parser = OutputParser::new(starts_in_reasoning);
        let mut out = ParsedOutput::default();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(chunk) {
            let piece: String = piece.iter().collect();
            for event in parser.push(&piece) {
                if let ParseEvent::Content(t) | ParseEvent::Reasoning(t) = &event {
                    assert!(!t.is_empty(), "empty text event");
                }
                out.apply(event);
            }
        }
        parser.finish().into_iter().for_each(|e| out.apply(e));
        out
    }

    /// Parses all at once and in every chunk size up to 13, asserting they agree.
    fn parse_all_ways(text: &str, starts_in_reasoning: bool) -> ParsedOutput {
        let whole = parse_output(text, starts_in_reasoning);
        for chunk in 1..=13 {
            assert_eq!(
                parse_in_chunks(text, starts_in_reasoning, chunk),
                whole,
                "chunk size {chunk} of {text:?}"
            );
        }
        whole
    }

    fn call(name: &str, arguments: Json) -> ToolCall {
        let Json::Object(arguments) = arguments else {
            panic!("arguments must be an object")
        };
        ToolCall {
            name: name.to_string(),
            arguments,
        }
    }

    #[test]
    fn reasoning_with_both_tags() {
        let out = parse_all_ways("<think>\nsmall ones\n</think>\n\n2", false);
        assert_eq!(out.reasoning, "small ones");
        assert_eq!(out.content, "2");
        assert!(out.tool_calls.is_empty());
    }

    #[test]
    fn generation_starting_inside_reasoning() {
        let out = parse_all_ways(
            "Let me think.\nStep 1 < step 2.\n</think>\n\nThe answer.",
            true,
        );
        assert_eq!(out.reasoning, "Let me think.\nStep 1 < step 2.");
        assert_eq!(out.content, "The answer.");
    }

    #[test]
    fn plain_answer_without_tags_keeps_inner_whitespace_and_angle_brackets() {
        let out = parse_all_ways("a < b and <b>bold</b>\n\nnext  para", false);
        assert_eq!(out.reasoning, "");
        assert_eq!(out.content, "a < b and <b>bold</b>\n\nnext  para");
    }

    #[test]
    fn unfinished_reasoning_stays_reasoning() {
        let out = parse_all_ways("still thinking </thi", true);
        assert_eq!(out.reasoning, "still thinking </thi");
        assert_eq!(out.content, "");
    }

    #[test]
    fn tool_calls_are_parsed_with_typed_arguments() {
        let text = "Checking both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"metric\": true, \"n\": [1, 2]}\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>";
        let out = parse_all_ways(text, false);
        assert_eq!(out.content, "Checking both.");
        assert_eq!(
            out.tool_calls,
            vec![
                call(
                    "get_weather",
                    json!({"city": "Paris", "days": 3, "opts": {"metric": true, "n": [1, 2]}, "note": "line one\nline two"})
                ),
                call("now", json!({})),
            ]
        );
        assert_eq!(
            out.tool_calls[0].arguments_json(),
            r#"{"city":"Paris","days":3,"opts":{"metric":true,"n":[1,2]},"note":"line one\nline two"}"#
        );
    }

    #[test]
    fn reasoning_then_tool_call() {
        let text = "I need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n東京\n</parameter>\n</function>\n</tool_call>";
        let out = parse_all_ways(text, true);
        assert_eq!(out.reasoning, "I need the weather.");
        assert_eq!(out.content, "");
        assert_eq!(
            out.tool_calls,
            vec![call("get_weather", json!({"city": "東京"}))]
        );
    }

    #[test]
    fn malformed_tool_call_is_kept_as_content() {
        let out = parse_all_ways("x <tool_call>\nnot a call\n</tool_call> y", false);
        assert_eq!(out.content, "x <tool_call>\nnot a call\n</tool_call> y");
        assert!(out.tool_calls.is_empty());
    }

    #[test]
    fn unterminated_tool_call_at_the_end() {
        // Cut off after the function closed: still a call.
        let out = parse_all_ways(
            "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n",
            false,
        );
        assert_eq!(out.tool_calls, vec![call("f", json!({"a": 1}))]);
        // Cut off before the function name ended: text.
        let out = parse_all_ways("ok <tool_call>\n<function=f", false);
        assert_eq!(out.content, "ok <tool_call>\n<function=f");
    }

    #[test]
    fn partial_tags_are_never_emitted_early() {
        let mut parser = OutputParser::new(false);
        assert_eq!(
            parser.push("Hello <tool"),
            vec![ParseEvent::Content("Hello".into())]
        );
        assert_eq!(parser.push("_ca"), vec![]);
        assert_eq!(
            parser.push("x"),
            vec![ParseEvent::Content(" <tool_cax".into())]
        );
        let mut parser = OutputParser::new(false);
        assert_eq!(parser.push("<thi"), vec![]);
        assert_eq!(parser.push("nk>r"), vec![ParseEvent::Reasoning("r".into())]);
    }
}
