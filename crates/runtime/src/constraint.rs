//! Structured outputs: a grammar (a JSON Schema, a regular expression, a list of choices or a
//! Lark grammar) compiled with `llguidance` into a [`Constraint`], which gives the set of tokens
//! allowed next at every step of a sequence. The token trie it walks is built once per model
//! from the checkpoint's `tokenizer.json` ([`Grammars`]); compiling is bounded by llguidance's
//! fuel and size limits, so a grammar too large or too slow to build is refused, not run.

use std::fmt;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, SimpleVob, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use spindle_text::Tokenizer;

use crate::error::{Result, RuntimeError};

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against a JSON Schema.
    JsonSchema(Value),
    /// Text matching a regular expression (whole).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar as llguidance reads it (which can embed JSON Schemas with `%json`).
    Lark(String),
}

impl Grammar {
    /// The grammar in llguidance's terms. JSON is generated compact (no whitespace between
    /// tokens, as `json.dumps(separators=(",", ":"))` writes it), so a model cannot pad it
    /// with whitespace forever; a schema that sets its own `x-guidance` options keeps them.
    fn top_level(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(compact(json!({
                "type": "object"
            }))),
            Grammar::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(grammar_error("a JSON schema must be an object"));
                }
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Choice(choices) => {
                if choices.is_empty() {
                    return Err(grammar_error("a choice needs at least one string"));
                }
                let quoted: Vec<String> = choices
                    .iter()
                    .map(|c| serde_json::to_string(c).expect("strings serialize"))
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", quoted.join(" | ")))
            }
            Grammar::Lark(lark) => {
                if lark.trim().is_empty() {
                    return Err(grammar_error("the grammar is empty"));
                }
                TopLevelGrammar::from_lark(lark.clone())
            }
        })
    }
}

/// A tool the model may call: its name and the JSON Schema of its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub parameters: Option<Value>,
}

impl Grammar {
    /// Tool calls in the Qwen3.5/3.6 format (`spindle_text`'s parser reads them back), one of
    /// `tools` each; several (one per line) when `parallel`, else exactly one. Each parameter
    /// value is JSON valid against the property's schema (a string in quotes, which the parser
    /// reads as that string); the schema's required properties always come, in the schema's
    /// order, optional ones may. Nothing comes before or after the calls.
    pub fn tool_calls(tools: &[ToolSpec], parallel: bool) -> Result<Self> {
        let strict: Vec<(ToolSpec, bool)> = tools.iter().map(|t| (t.clone(), true)).collect();
        Self::calls_grammar(&strict, parallel, false)
    }

    /// What a model may answer when it may call `tools` but need not (`tool_choice` "auto")
    /// and some of them are `strict`: any text, then optionally tool calls as
    /// [`Grammar::tool_calls`] writes them (nothing after them). A strict tool's arguments
    /// follow its schema; any other tool's call holds its name and free text up to the
    /// call's end. Text never holds a call's opening special token, so a call cannot be
    /// written around the grammar.
    pub fn optional_tool_calls(tools: &[(ToolSpec, bool)], parallel: bool) -> Result<Self> {
        Self::calls_grammar(tools, parallel, true)
    }

    fn calls_grammar(tools: &[(ToolSpec, bool)], parallel: bool, text_first: bool) -> Result<Self> {
        if tools.is_empty() {
            return Err(grammar_error("a tool call grammar needs at least one tool"));
        }
        let literal = |s: &str| serde_json::to_string(s).expect("strings serialize");
        let calls = if parallel {
            "call (\"\\n\" call)*"
        } else {
            "call"
        };
        let mut rules = vec![
            if text_first {
                format!("start: {TOOL_FREE_TEXT}? calls?\ncalls: {calls}")
            } else {
                format!("start: {calls}")
            },
            format!(
                "call: {}",
                (0..tools.len())
                    .map(|i| format!("call_{i}"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            ),
        ];
        for (i, (tool, strict)) in tools.iter().enumerate() {
            // The call's markers are rules the compiler defines for the model's tokenizer: its
            // special tokens where it has them ([`Grammars::compile`]).
            let mut parts = vec![format!(
                "{TOOL_CALL_OPEN} {}",
                literal(&format!("\n<function={}>\n", tool.name))
            )];
            if !strict {
                parts.push(format!("{TOOL_FREE_TEXT}? {TOOL_CALL_CLOSE}"));
                rules.push(format!("call_{i}: {}", parts.join(" ")));
                continue;
            }
            let empty = Value::Object(Default::default());
            let schema = tool.parameters.as_ref().unwrap_or(&empty);
            let properties = schema.get("properties").and_then(Value::as_object);
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (k, (name, property)) in properties.into_iter().flatten().enumerate() {
                let property = compact(property.clone());
                let rule = format!("p_{i}_{k}");
                rules.push(format!(
                    "{rule}: {} %json {} {}",
                    literal(&format!("<parameter={name}>\n")),
                    property,
                    literal("\n</parameter>\n")
                ));
                parts.push(if required.contains(&name.as_str()) {
                    rule
                } else {
                    format!("{rule}?")
                });
            }
            parts.push(format!("{} {TOOL_CALL_CLOSE}", literal("</function>\n")));
            rules.push(format!("call_{i}: {}", parts.join(" ")));
        }
        Ok(Grammar::Lark(rules.join("\n")))
    }
}

/// The rules a tool-call grammar opens and closes each call with; [`Grammars::compile`]
/// defines them as the tokenizer's `<tool_call>` / `</tool_call>` special tokens when it marks
/// them special (the Qwen3.5/3.6 tokenizers: the model writes those tokens, not their
/// spelling), else as the text.
const TOOL_CALL_OPEN: &str = "tool_call_open";
const TOOL_CALL_CLOSE: &str = "tool_call_close";

/// The lexeme of free text in a tool-call grammar (text before optional calls, a non-strict
/// call's body), defined with the markers: any text that cannot open a call (with special
/// markers any text at all, since text never holds a special token; else text that does not
/// spell `<tool_call>`).
const TOOL_FREE_TEXT: &str = "TOOL_FREE_TEXT";

/// The largest grammar compiled, in bytes of its text (a schema's JSON, a regex, a Lark
/// grammar, the choices together).
pub const MAX_GRAMMAR_BYTES: usize = 128 << 10;

/// The longest a grammar may take to compile.
pub const COMPILE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The compiler thread's stack: llguidance recurses once per level of nesting (about 2 KiB a
/// level); address space only, touched as deep as a grammar goes.
const COMPILE_STACK_BYTES: usize = 256 << 20;

impl Grammar {
    /// The grammar's size in bytes of text.
    fn size(&self) -> usize {
        match self {
            Grammar::JsonObject => 0,
            Grammar::JsonSchema(schema) => schema.to_string().len(),
            Grammar::Regex(text) | Grammar::Lark(text) => text.len(),
            Grammar::Choice(choices) => choices.iter().map(|c| c.len() + 1).sum(),
        }
    }
}

/// `schema` with compact JSON unless it sets `x-guidance` itself.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_flexible": false}));
    }
    schema
}

/// The id of added token `text` in a `tokenizer.json`, if it has one.
fn tokenizer_id(json: &Value, text: &str) -> Option<u32> {
    json.get("added_tokens")?
        .as_array()?
        .iter()
        .find(|t| t.get("content").and_then(Value::as_str) == Some(text))
        .and_then(|t| t.get("id")?.as_u64())
        .map(|id| id as u32)
}

fn grammar_error(message: impl Into<String>) -> RuntimeError {
    RuntimeError::Grammar(message.into())
}

/// The token trie of one model with llguidance's parser factory: built once (a 248k-id
/// vocabulary takes a fraction of a second), shared by every constrained sequence.
pub struct Grammars {
    factory: Arc<ParserFactory>,
    /// The model's end-of-sequence ids: allowed wherever the grammar may end.
    eos_ids: Vec<u32>,
    /// The Lark rules defining [`TOOL_CALL_OPEN`] and [`TOOL_CALL_CLOSE`] for this tokenizer.
    tool_call_markers: String,
}

impl fmt::Debug for Grammars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

/// The tokenizer as llguidance sees it: the trie of every id's bytes, and the real tokenizer
/// for text it forces (so forced text is tokenized as the model was trained on it).
struct TokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for TokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

impl Grammars {
    /// The trie for `tokenizer` (from its `tokenizer.json` form, written back by the tokenizer:
    /// a GGUF model's tokenizer has no such file, and its path is the model's) over
    /// `vocab_size` logits (ids past the tokenizer's have no bytes and are never allowed).
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize, eos_ids: &[u32]) -> Result<Self> {
        let path = tokenizer.path().to_path_buf();
        let file_error = |message: String| RuntimeError::File {
            path: path.clone(),
            message,
        };
        let text = tokenizer.to_json().map_err(|e| file_error(e.to_string()))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| file_error(e.to_string()))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| file_error(format!("cannot build the token trie: {e}")))?;
        if words.len() > vocab_size {
            return Err(file_error(format!(
                "{} token ids but the model has {vocab_size} logits",
                words.len()
            )));
        }
        words.resize(vocab_size, Vec::new());
        let eos = *eos_ids.first().ok_or_else(|| {
            file_error("the model names no end-of-sequence token: a grammar could never end".into())
        })?;
        let info = TokRxInfo::new(vocab_size as u32, eos);
        let env = TokEnv {
            trie: TokTrie::from(&info, &words),
            tokenizer,
        };
        let env: toktrie::TokEnv = Arc::new(env);
        let trie = env.tok_trie();
        let special = |text: &str| {
            tokenizer_id(&json, text).is_some_and(|id| {
                (id as usize) < trie.vocab_size()
                    && trie.token(id).first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER)
            })
        };
        let marker = |text: &str| match special(text) {
            true => text.to_owned(),
            false => serde_json::to_string(text).expect("strings serialize"),
        };
        let free_text = match special("<tool_call>") {
            true => r"/(.|\n)+/".to_owned(),
            false => r"/(.|\n)+/ & ~/(.|\n)*<tool_call>(.|\n)*/".to_owned(),
        };
        let tool_call_markers = format!(
            "\n{TOOL_CALL_OPEN}: {}\n{TOOL_CALL_CLOSE}: {}\n{TOOL_FREE_TEXT}: {free_text}\n",
            marker("<tool_call>"),
            marker("</tool_call>")
        );
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| file_error(format!("cannot build the grammar engine: {e}")))?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
            eos_ids: eos_ids.to_vec(),
            tool_call_markers,
        })
    }

    /// The bytes of token `id` (a special token's spelling; nothing past the tokenizer).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let trie = self.factory.tok_env().tok_trie();
        if id as usize >= trie.vocab_size() {
            return Vec::new();
        }
        let mut bytes = trie.token(id).to_vec();
        if bytes.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
            bytes.remove(0);
        }
        bytes
    }

    /// Compiles `grammar`; a bad schema, regex or grammar, one past llguidance's limits, one
    /// larger than [`MAX_GRAMMAR_BYTES`] or one that takes longer than [`COMPILE_TIMEOUT`] is
    /// [`RuntimeError::Grammar`] naming the problem. Compiling runs on its own thread with a
    /// large stack (llguidance recurses over deeply nested grammars), so no grammar can
    /// overflow the caller's stack; one past the timeout is left to finish there, unheard.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint> {
        let size = grammar.size();
        if size > MAX_GRAMMAR_BYTES {
            return Err(grammar_error(format!(
                "the grammar is {size} bytes; at most {MAX_GRAMMAR_BYTES} are compiled"
            )));
        }
        // A tool-call grammar's markers, defined for this tokenizer.
        let defined;
        let grammar = match grammar {
            Grammar::Lark(text)
                if text.contains(TOOL_CALL_OPEN)
                    && !text.contains(&format!("{TOOL_CALL_OPEN}:")) =>
            {
                defined = Grammar::Lark(format!("{text}{}", self.tool_call_markers));
                &defined
            }
            _ => grammar,
        };
        let top = grammar.top_level()?;
        let factory = Arc::clone(&self.factory);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("spindle-grammar".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn(move || {
                let compiled = factory.create_parser(top).map(|p| Matcher::new(Ok(p)));
                let _ = tx.send(compiled.map_err(|e| e.to_string()));
            })
            .map_err(|e| grammar_error(format!("cannot start the grammar compiler: {e}")))?;
        let matcher = match rx.recv_timeout(COMPILE_TIMEOUT) {
            Ok(matcher) => matcher.map_err(grammar_error)?,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                return Err(grammar_error(format!(
                    "the grammar took longer than {} s to compile",
                    COMPILE_TIMEOUT.as_secs()
                )))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(grammar_error("the grammar compiler failed"))
            }
        };
        if let Some(e) = matcher.get_error() {
            return Err(grammar_error(e));
        }
        Ok(Constraint {
            matcher,
            eos_ids: self.eos_ids.clone(),
            after: None,
        })
    }
}

/// A compiled grammar for one sequence: which tokens may come next, advanced token by token.
/// Cloning gives an independent copy in the same state (each of `n` choices has its own).
pub struct Constraint {
    matcher: Matcher,
    eos_ids: Vec<u32>,
    /// A token after which the constraint starts (`</think>`: reasoning runs free).
    after: Option<u32>,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            eos_ids: self.eos_ids.clone(),
            after: self.after,
        }
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("after", &self.after)
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

/// The tokens allowed at one step.
#[derive(Clone, Debug)]
pub struct TokenMask {
    allowed: SimpleVob,
    /// Whether the only tokens allowed end the sequence (the grammar is complete).
    only_eos: bool,
}

impl TokenMask {
    /// Sets every logit the mask does not allow to -inf.
    pub fn apply(&self, logits: &mut [f32]) {
        for (id, logit) in logits.iter_mut().enumerate() {
            if !self.allowed.get(id) {
                *logit = f32::NEG_INFINITY;
            }
        }
    }

    /// The allowed ids as `words` bit words (bit `id % 32` of word `id / 32`; ids past the
    /// grammar's vocabulary are not allowed; bits past the model's vocabulary are never read).
    pub fn words(&self, words: usize) -> Vec<u32> {
        let mut bits: Vec<u32> = self
            .allowed
            .as_slice()
            .iter()
            .copied()
            .take(words)
            .collect();
        bits.resize(words, 0);
        bits
    }

    pub fn allows(&self, id: u32) -> bool {
        (id as usize) < self.allowed.len() && self.allowed.get(id as usize)
    }

    /// Whether the grammar is complete and only end-of-sequence ids may follow.
    pub fn only_eos(&self) -> bool {
        self.only_eos
    }
}

impl Constraint {
    /// The constraint starting only after `token` is generated (the end of a reasoning
    /// block): tokens before it are free and not fed to the grammar.
    pub fn after(mut self, token: u32) -> Self {
        self.after = Some(token);
        self
    }

    /// Whether the grammar applies to the next token.
    pub fn active(&self) -> bool {
        self.after.is_none()
    }

    /// The tokens allowed next (`None` while inactive). Every end-of-sequence id is allowed
    /// where the grammar may end.
    pub fn mask(&mut self) -> Result<Option<TokenMask>> {
        if !self.active() {
            return Ok(None);
        }
        let mut allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| grammar_error(format!("the grammar failed: {e}")))?;
        let trie_eos = self
            .matcher
            .tok_env()
            .ok()
            .map(|env| env.tok_trie().eos_token());
        let may_end = trie_eos.is_some_and(|eos| allowed.is_allowed(eos));
        if may_end {
            for &id in &self.eos_ids {
                if (id as usize) < allowed.len() {
                    allowed.allow_token(id);
                }
            }
        }
        let eos_in_range = self
            .eos_ids
            .iter()
            .filter(|&&id| (id as usize) < allowed.len())
            .count();
        let only_eos = may_end && allowed.num_set() == eos_in_range;
        Ok(Some(TokenMask { allowed, only_eos }))
    }

    /// Advances past the generated token `id`: starts the constraint after its trigger, feeds
    /// the grammar while active (end-of-sequence ids end the sequence and are not fed). A
    /// token the grammar does not allow is an error.
    pub fn accept(&mut self, id: u32) -> Result<()> {
        if let Some(trigger) = self.after {
            if id == trigger {
                self.after = None;
            }
            return Ok(());
        }
        if self.eos_ids.contains(&id) {
            return Ok(());
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| grammar_error(format!("token {id} does not fit the grammar: {e}")))
    }

    /// Whether the grammar has been matched completely (nothing but the end may follow).
    pub fn is_complete(&self) -> bool {
        self.after.is_none() && self.matcher.is_stopped()
    }
}

/// Sets every logit whose bit in `bits` (bit `id % 32` of word `id / 32`) is clear to -inf:
/// the host's application of a sequence's token mask (the CUDA sampler applies it as it reads each
/// logit).
pub fn apply_mask_words(logits: &mut [f32], bits: &[u32]) {
    for (id, logit) in logits.iter_mut().enumerate() {
        let allowed = bits
            .get(id / 32)
            .is_some_and(|w| w & (1u32 << (id % 32)) != 0);
        if !allowed {
            *logit = f32::NEG_INFINITY;
        }
    }
}
