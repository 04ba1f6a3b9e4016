//! Images in requests: base64 payloads (OpenAI `data:` URLs, Anthropic `base64` sources,
//! Ollama `images`) decoded at the edge into [`RequestImage`]s named by the field that sent
//! them; message content with images in the shape the chat template reads; and, on a
//! blocking thread, each image prepared for the tower and its `<|image_pad|>` expanded.
//!
//! Every API's parser hands its images here in order of appearance, which is the order the
//! template writes their placeholders in.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use serde_json::{json, Value};
use spindle_vision::{ImageInput, Limits, PreparedImage, VisionError};

use crate::error::ApiError;
use crate::state::AppState;
use spindle_runtime::images::TokenPrompt;

/// An image a request carries: its encoded bytes and the request field they came from
/// (`messages[0].content[1]`), which every error about it names.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestImage {
    pub bytes: Vec<u8>,
    pub param: String,
}

/// Standard base64, with or without padding.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Decodes a base64 image payload (ASCII whitespace, as in wrapped base64, is skipped).
pub fn from_base64(data: &str, param: &str) -> Result<RequestImage, ApiError> {
    let decoded = if data.bytes().any(|b| b.is_ascii_whitespace()) {
        let compact: Vec<u8> = data.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        BASE64.decode(compact)
    } else {
        BASE64.decode(data)
    };
    let bytes = decoded.map_err(|e| {
        ApiError::invalid(
            param,
            format!("{param}: the image is not valid base64: {e}"),
        )
    })?;
    if bytes.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("{param}: the image is empty"),
        ));
    }
    Ok(RequestImage {
        bytes,
        param: param.to_owned(),
    })
}

/// An image URL: `data:image/...;base64,...` is decoded; a remote URL is refused (the server
/// fetches nothing).
pub fn from_url(url: &str, param: &str) -> Result<RequestImage, ApiError> {
    let Some(rest) = url.strip_prefix("data:") else {
        let message = if url.starts_with("http://") || url.starts_with("https://") {
            "remote image URLs are not fetched: send a data: URL (data:image/png;base64,...)"
        } else {
            "an image URL must be a data: URL (data:image/png;base64,...)"
        };
        return Err(ApiError::invalid(param, format!("{param}: {message}")));
    };
    let (header, data) = rest.split_once(',').ok_or_else(|| {
        ApiError::invalid(
            param,
            format!("{param}: a data: URL needs a comma before its data"),
        )
    })?;
    let Some(media_type) = header.strip_suffix(";base64") else {
        return Err(ApiError::invalid(
            param,
            format!("{param}: the data: URL must be base64 (data:image/png;base64,...)"),
        ));
    };
    check_media_type(media_type, param)?;
    from_base64(data, param)
}

/// Refuses a media type that is not an image (`image/*`, or empty as a data: URL may have).
/// The format itself is read from the bytes, whatever the type says.
pub fn check_media_type(media_type: &str, param: &str) -> Result<(), ApiError> {
    let media_type = media_type.split(';').next().unwrap_or("").trim();
    if media_type.is_empty() || media_type.to_ascii_lowercase().starts_with("image/") {
        return Ok(());
    }
    Err(ApiError::invalid(
        param,
        format!("{param}: media type {media_type:?} is not an image: send PNG, JPEG, WebP or GIF"),
    ))
}

/// Message content as it is built from a request's parts: text, and images as the chat
/// template's `{"type": "image"}` items (which it renders as
/// `<|vision_start|><|image_pad|><|vision_end|>`).
#[derive(Debug, Default)]
pub struct Content {
    parts: Vec<Value>,
    text: String,
    images: usize,
}

impl Content {
    pub fn push_text(&mut self, text: &str) {
        self.text.push_str(text);
    }

    pub fn push_image(&mut self) {
        self.flush_text();
        self.parts.push(json!({"type": "image"}));
        self.images += 1;
    }

    fn flush_text(&mut self) {
        if !self.text.is_empty() {
            let text = std::mem::take(&mut self.text);
            self.parts.push(json!({"type": "text", "text": text}));
        }
    }

    /// No text and no images.
    pub fn is_empty(&self) -> bool {
        self.images == 0 && self.text.is_empty() && self.parts.is_empty()
    }

    /// The content for the template: the joined text when there are no images (exactly what
    /// a text request renders), else the list of text and image items in order.
    pub fn into_value(mut self) -> Value {
        if self.images == 0 {
            return Value::String(self.text);
        }
        self.flush_text();
        Value::Array(self.parts)
    }
}

/// Refuses images sent to a model that cannot read them.
pub fn check_model_reads_images(
    input: Option<&ImageInput>,
    images: &[RequestImage],
) -> Result<(), ApiError> {
    match (input, images.first()) {
        (None, Some(first)) => Err(ApiError::invalid(
            &first.param,
            format!(
                "{}: this model has no vision tower (its config.json has no vision_config): \
                 send text only",
                first.param
            ),
        )),
        _ => Ok(()),
    }
}

/// Prepares each image for the tower (decode, resize, patchify), bounded so that all images
/// together become at most `max_tokens` image tokens. Errors name the image's field.
pub fn prepare_images(
    images: &[RequestImage],
    input: &ImageInput,
    max_tokens: usize,
) -> Result<Vec<PreparedImage>, ApiError> {
    let mut out = Vec::with_capacity(images.len());
    let mut tokens = 0usize;
    for image in images {
        let limits = Limits {
            max_tokens: max_tokens.saturating_sub(tokens),
            ..Limits::default()
        };
        let prepared = spindle_vision::prepare_within(&image.bytes, &input.geometry, &limits)
            .map_err(|e| image_error(e, image, tokens, max_tokens))?;
        tokens += prepared.tokens(input.geometry.merge);
        out.push(prepared);
    }
    Ok(out)
}

fn image_error(e: VisionError, image: &RequestImage, used: usize, max: usize) -> ApiError {
    let message = match e {
        VisionError::TooManyTokens {
            width,
            height,
            tokens,
            ..
        } => format!(
            "the image is {width}x{height} and becomes {tokens} image tokens; with the {used} \
             of the images before it, more than the model's context of {max} tokens"
        ),
        other => other.to_string(),
    };
    let param = &image.param;
    ApiError::invalid(param, format!("{param}: {message}"))
}

/// Expands each image's single `<|image_pad|>` in `ids` to its token count; a pad without an
/// image (or an image without a pad) is refused.
pub fn expand_pads(
    ids: &[u32],
    input: &ImageInput,
    images: &[PreparedImage],
    param: &str,
) -> Result<Vec<u32>, ApiError> {
    spindle_vision::expand_image_pads(ids, input.image_token_id, images, input.geometry.merge)
        .map_err(|e| ApiError::invalid(param, e.to_string()))
}

/// The one place a request's prompt goes to the engine: its ids (pads expanded) and its
/// prepared images, in pad order.
pub fn engine_prompt(ids: Vec<u32>, images: Vec<PreparedImage>) -> TokenPrompt {
    TokenPrompt::new(ids, images)
}

/// [`engine_prompt`] for a request, checked against the served model first (pads and images
/// that do not pair up, or a model that cannot take images): a refusal is a 400 naming `param`.
pub(crate) fn request_engine_prompt(
    state: &AppState,
    ids: Vec<u32>,
    images: Vec<PreparedImage>,
    param: &str,
) -> Result<TokenPrompt, ApiError> {
    state
        .model
        .backend
        .check_images(&ids, &images)
        .map_err(|e| ApiError::from_prepare(e, param))?;
    Ok(engine_prompt(ids, images))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls_decode_and_everything_else_is_refused_by_field() {
        let ok = from_url("data:image/png;base64,iVBORw0KGgo=", "u").unwrap();
        assert_eq!(ok.bytes, b"\x89PNG\r\n\x1a\n");
        // Padding optional, wrapped lines allowed.
        assert_eq!(
            from_url("data:image/png;base64,iVBO\nRw0KGgo", "u")
                .unwrap()
                .bytes,
            ok.bytes
        );
        let message =
            |url: &str| from_url(url, "messages[0].content[1].image_url.url").unwrap_err();
        let remote = message("https://example.com/cat.png");
        assert_eq!(
            remote.param.as_deref(),
            Some("messages[0].content[1].image_url.url")
        );
        assert!(remote.message.contains("remote image URLs are not fetched"));
        assert!(message("data:image/png;base64,!!!")
            .message
            .contains("not valid base64"));
        assert!(message("data:image/png,rawbytes")
            .message
            .contains("must be base64"));
        assert!(message("data:text/plain;base64,aGk=")
            .message
            .contains("not an image"));
        assert!(message("file:///etc/passwd")
            .message
            .contains("must be a data: URL"));
    }

    #[test]
    fn content_stays_a_string_without_images() {
        let mut c = Content::default();
        c.push_text("a");
        c.push_text("b");
        assert_eq!(c.into_value(), json!("ab"));
        let mut c = Content::default();
        c.push_text("look: ");
        c.push_image();
        c.push_text("what is it?");
        assert_eq!(
            c.into_value(),
            json!([{"type": "text", "text": "look: "}, {"type": "image"},
                   {"type": "text", "text": "what is it?"}])
        );
    }
}
