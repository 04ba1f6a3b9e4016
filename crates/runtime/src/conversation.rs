//! A multi-turn chat that keeps its session between turns: each turn feeds only the new
//! tokens (the end of the previous answer and the new user message), never the whole history.

use serde_json::{json, Map, Value};
use spindle_text::{parse_output, ParsedOutput, PromptText};

use crate::backend::BackendSession;
use crate::error::{Result, RuntimeError};
use crate::generate::{Completion, Finish, Flow, GenerateOptions};
use crate::model::{ends_in_open_think, Model};

/// The end-of-turn marker of the Qwen chat format.
const END_OF_TURN: &str = "<|im_end|>";

pub struct Conversation {
    pub messages: Vec<Value>,
    pub vars: Map<String, Value>,
    /// Created by the first turn (a backend session may fail to allocate).
    session: Option<BackendSession>,
    /// Tokens generated but not yet fed to the session.
    pending: Vec<u32>,
    /// Whether the last answer ended with the end-of-turn token.
    closed: bool,
    /// Tokens fed to the session by the last turn (prompt side).
    pub last_feed_tokens: usize,
}

/// One turn's result.
pub struct Turn {
    pub completion: Completion,
    pub parsed: ParsedOutput,
}

impl Conversation {
    pub fn new(_model: &Model, system: Option<&str>, vars: Map<String, Value>) -> Self {
        let messages = system
            .map(|s| vec![json!({"role": "system", "content": s})])
            .unwrap_or_default();
        Conversation {
            messages,
            vars,
            session: None,
            pending: Vec::new(),
            closed: true,
            last_feed_tokens: 0,
        }
    }

    /// The conversation rendered; message text that spells special tokens is marked plain.
    fn render(&self, model: &Model, generation_prompt: bool) -> Result<PromptText> {
        let template = model.template.as_ref().ok_or_else(|| RuntimeError::File {
            path: model.dir.clone(),
            message: "chat needs a chat template (chat_template.jinja or tokenizer_config.json)"
                .into(),
        })?;
        Ok(template.render_prompt(
            &Value::Array(self.messages.clone()),
            None,
            generation_prompt,
            &self.vars,
            &model.tokenizer.special_spellings(),
        )?)
    }

    /// Tokens that bring the session from the end of the last answer to the new prompt.
    ///
    /// Templates may render history differently once it is no longer the last turn (the
    /// Qwen3.6 template drops the empty think block of earlier answers), so the prompt is not
    /// compared with the history text. Instead every rendered message ends with the
    /// end-of-turn marker: after the k markers the session already holds (k = markers in the
    /// history rendered alone), the rest of the new rendering is what is new.
    fn tokens_to_feed(
        &mut self,
        model: &Model,
        previous: Option<PromptText>,
        prompt: &PromptText,
    ) -> Result<Vec<u32>> {
        // Only the template's own markers count: message text may spell `<|im_end|>`.
        let resume_at = previous.and_then(|p| {
            let held = p.template_matches(END_OF_TURN).count();
            let i = prompt
                .template_matches(END_OF_TURN)
                .nth(held.checked_sub(1)?)?;
            Some(i + END_OF_TURN.len())
        });
        match resume_at {
            Some(at) if self.context_tokens() > 0 => {
                let mut ids = std::mem::take(&mut self.pending);
                if !self.closed {
                    ids.extend(model.tokenizer.encode(END_OF_TURN, true)?);
                }
                ids.extend(model.tokenizer.encode_prompt(&prompt.tail(at))?);
                Ok(ids)
            }
            // Otherwise start over from the full rendering.
            _ => {
                // Drop the old session first: its memory may be what the new one needs.
                self.session = None;
                self.session = Some(model.new_session()?);
                self.pending.clear();
                Ok(model.tokenizer.encode_prompt(prompt)?)
            }
        }
    }

    /// Adds a user message, generates the answer and records it in the history.
    pub fn turn(
        &mut self,
        model: &Model,
        user: &str,
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> Flow,
    ) -> Result<Turn> {
        // The history as the template renders it now; if it cannot be rendered on its own
        // (templates may demand a user message), fall back to a full prefill.
        let previous = if self.context_tokens() > 0 {
            self.render(model, false).ok()
        } else {
            None
        };
        self.messages.push(json!({"role": "user", "content": user}));
        let prompt = self.render(model, true)?;
        let feed = self.tokens_to_feed(model, previous, &prompt)?;
        self.last_feed_tokens = feed.len();
        let session = match &mut self.session {
            Some(session) => session,
            None => self.session.insert(model.new_session()?),
        };
        let completion = match model.generate(session, &feed, options, on_text) {
            Ok(completion) => completion,
            Err(e) => {
                // The session may hold part of this turn (or refuse further steps): forget the
                // turn and start the next one over from the full rendering.
                self.session = None;
                self.pending.clear();
                self.messages.pop();
                return Err(e);
            }
        };
        self.pending = completion.ids.last().copied().into_iter().collect();
        self.closed = matches!(completion.finish, Finish::Eos(id) if model.tokenizer.token_to_id(END_OF_TURN) == Some(id));
        let parsed = parse_output(&completion.text, ends_in_open_think(&prompt.text));
        let mut message = json!({"role": "assistant", "content": parsed.content});
        if !parsed.reasoning.is_empty() {
            message["reasoning_content"] = json!(parsed.reasoning);
        }
        self.messages.push(message);
        Ok(Turn { completion, parsed })
    }

    /// Tokens held by the session.
    pub fn context_tokens(&self) -> usize {
        self.session.as_ref().map_or(0, BackendSession::position)
    }
}
