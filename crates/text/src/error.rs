//! The one error type of this crate: every variant names the file, field or input at fault.

use std::path::PathBuf;

/// What went wrong turning text into tokens, templates into prompts, or tokens back into text.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A file that must exist could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file is larger than spindle reads for its kind.
    #[error("{path} is {size} bytes, more than the {max_bytes} bytes allowed for this file")]
    FileTooLarge {
        path: PathBuf,
        size: u64,
        max_bytes: u64,
    },
    /// A file was read but is not what it should be (bad JSON, wrong field types, ...).
    #[error("{path}: {message}")]
    InvalidFile { path: PathBuf, message: String },
    /// `tokenizer.json` could not be loaded by the `tokenizers` library.
    #[error("cannot load tokenizer {path}: {message}")]
    TokenizerLoad { path: PathBuf, message: String },
    /// Encoding or decoding failed inside the `tokenizers` library.
    #[error("tokenizer failed to {operation}: {message}")]
    Tokenizer {
        operation: &'static str,
        message: String,
    },
    /// A model directory has no chat template in any of the places transformers looks.
    #[error("no chat template in {dir}: expected chat_template.jinja or a `chat_template` field in tokenizer_config.json")]
    NoChatTemplate { dir: PathBuf },
    /// A list of named chat templates has no template this request can use.
    #[error("no chat template named {name:?} (available: {available})")]
    UnknownTemplateName { name: String, available: String },
    /// The template source does not parse as Jinja.
    #[error("chat template {name:?} does not compile: {message}")]
    TemplateSyntax { name: String, message: String },
    /// The template called `raise_exception(message)`: the conversation is one it refuses.
    #[error("{message}")]
    TemplateException { message: String },
    /// Rendering failed for another reason (an undefined attribute, a bad filter argument, ...).
    #[error("rendering chat template {name:?} failed: {message}")]
    TemplateRender { name: String, message: String },
    /// The template ran past its budget of steps or output: a template that loops or grows
    /// without end, stopped.
    #[error("chat template {name:?} exceeded its budget of {budget}; a real chat template needs far less, so this one is refused")]
    TemplateBudget { name: String, budget: String },
    /// A text has more tokens than the caller can use; counting stopped past the limit.
    #[error("the prompt has more than {limit} tokens, the most the context holds (counting stopped at {counted})")]
    TooManyTokens { counted: usize, limit: usize },
    /// The request was cancelled while its prompt was being rendered.
    #[error("cancelled while rendering the chat template")]
    Cancelled,
    /// A render argument has the wrong shape (e.g. `messages` is not a list).
    #[error("chat template argument `{field}`: {message}")]
    InvalidTemplateArgument {
        field: &'static str,
        message: String,
    },
}

impl TextError {
    pub(crate) fn invalid_file(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        TextError::InvalidFile {
            path: path.into(),
            message: message.into(),
        }
    }
}
