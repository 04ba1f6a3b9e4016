//! Images in requests: each API's image parts parsed (data URLs, base64 sources, Ollama
//! `images`), refused by field when they cannot be read, and on a model with image input
//! prepared with their pads expanded (seen in `count_tokens`) and answered: the embedded demo
//! carries a tiny vision tower.

use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use base64::Engine;
use serde_json::{json, Value};
use spindle_server::open_model;
use spindle_server::spindle_runtime::{demo_dir, Model};

use crate::common::TestServer;

/// A copy of the demo checkpoint in a temporary directory, `config.json` edited by `edit`.
fn demo_copy(edit: impl FnOnce(&mut Value, &Path)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(demo_dir().unwrap()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
    }
    let path = tmp.path().join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config, tmp.path());
    std::fs::write(&path, config.to_string()).unwrap();
    tmp
}

/// The demo checkpoint (its tiny tower: `image_token_id` 4075, its tokenizer's
/// `<|image_pad|>`) with processor bounds 4096..262144 pixels, so small images stay small.
fn vision_demo() -> (Arc<Model>, String) {
    static MODEL: OnceLock<(tempfile::TempDir, Arc<Model>)> = OnceLock::new();
    let (_, model) = MODEL.get_or_init(|| {
        let tmp = demo_copy(|_, dir| {
            std::fs::write(
                dir.join("preprocessor_config.json"),
                json!({"size": {"shortest_edge": 4096, "longest_edge": 262144}}).to_string(),
            )
            .unwrap()
        });
        let (model, _) = open_model(Some(tmp.path()), None, &Default::default()).unwrap();
        (tmp, model)
    });
    (Arc::clone(model), "vision-demo".into())
}

/// The demo without image input (no `vision_config`, no image token ids).
fn text_only_demo() -> (Arc<Model>, String) {
    static MODEL: OnceLock<(tempfile::TempDir, Arc<Model>)> = OnceLock::new();
    let (_, model) = MODEL.get_or_init(|| {
        let tmp = demo_copy(|config, _| {
            let obj = config.as_object_mut().unwrap();
            for key in ["vision_config", "image_token_id", "video_token_id"] {
                obj.remove(key);
            }
        });
        let (model, _) = open_model(Some(tmp.path()), None, &Default::default()).unwrap();
        (tmp, model)
    });
    (Arc::clone(model), "text-demo".into())
}

/// A `w` x `h` RGB PNG.
fn png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 77]));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn data_url(bytes: &[u8]) -> String {
    format!("data:image/png;base64,{}", b64(bytes))
}

fn openai_image(url: &str) -> Value {
    json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in the picture?"},
        {"type": "image_url", "image_url": {"url": url, "detail": "high"}}]}]})
}

fn anthropic_count(content: Value) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": content}]})
}

fn error(body: &Value) -> (&str, &str) {
    let e = &body["error"];
    (
        e["param"].as_str().unwrap_or(""),
        e["message"].as_str().unwrap_or(""),
    )
}

#[tokio::test]
async fn a_text_only_model_refuses_images_by_field() {
    let (model, id) = text_only_demo();
    let server = TestServer::start_with(model, id, |_| {}).await;
    let (status, body) = server
        .post(
            "/v1/chat/completions",
            &openai_image(&data_url(&png(64, 64))),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (param, message) = error(&body);
    assert_eq!(param, "messages[0].content[1].image_url.url");
    assert!(message.contains("no vision tower"), "{message}");
    // Refusals that need no model: a remote URL, bad base64.
    let (status, body) = server
        .post(
            "/v1/chat/completions",
            &openai_image("https://example.com/cat.png"),
        )
        .await;
    assert_eq!(status, 400);
    let (param, message) = error(&body);
    assert_eq!(param, "messages[0].content[1].image_url.url");
    assert!(
        message.contains("remote image URLs are not fetched"),
        "{message}"
    );
    let (status, body) = server
        .post(
            "/v1/chat/completions",
            &openai_image("data:image/png;base64,@@@@"),
        )
        .await;
    assert_eq!(status, 400);
    assert!(error(&body).1.contains("not valid base64"), "{body}");
    let (status, body) = server
        .post(
            "/api/chat",
            &json!({"model": "m", "stream": false, "messages": [
                {"role": "user", "content": "what?", "images": [b64(&png(32, 32))]}]}),
        )
        .await;
    assert_eq!(status, 400);
    // Ollama's errors are {"error": "message"}; the message names the field.
    let message = body["error"].as_str().unwrap_or_default();
    assert!(message.starts_with("messages[0].images[0]: "), "{body}");
    assert!(message.contains("no vision tower"), "{body}");
    server.stop().await;
}

#[tokio::test]
async fn image_pads_are_expanded_to_the_images_token_count() {
    let (model, id) = vision_demo();
    let server = TestServer::start_with(model, id, |_| {}).await;
    let count = |content: Value| {
        let server = &server;
        async move {
            let (status, body) = server
                .post("/v1/messages/count_tokens", &anthropic_count(content))
                .await;
            assert_eq!(status, 200, "{body}");
            body["input_tokens"].as_u64().unwrap()
        }
    };
    let text = count(json!([{"type": "text", "text": "What is this?"}])).await;
    let image = |w, h| {
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png",
            "data": b64(&png(w, h))}})
    };
    // 64x64 (within 4096..262144 pixels, no resize): grid 4x4, 4 tokens, plus the
    // <|vision_start|> and <|vision_end|> around them.
    let one = count(json!([image(64, 64), {"type": "text", "text": "What is this?"}])).await;
    assert_eq!(one, text + 2 + 4);
    // 96x160 -> grid 6x10 -> 15 tokens; 30x40 -> min_pixels upscales it to 64x96 -> 6.
    let two = count(
        json!([image(96, 160), {"type": "text", "text": "What is this?"},
        image(30, 40)]),
    )
    .await;
    assert_eq!(two, text + 2 + 15 + 2 + 6);
    server.stop().await;
}

#[tokio::test]
async fn every_api_answers_with_images_and_no_vision_refuses_them() {
    let (model, id) = vision_demo();
    let server = TestServer::start_with(model, id, |_| {}).await;
    let picture = png(64, 64);
    let (status, body) = server
        .post("/v1/chat/completions", &openai_image(&data_url(&picture)))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty(),
        "{body}"
    );
    let (status, body) = server
        .post(
            "/v1/messages",
            &json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                 "data": b64(&picture)}}]}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for (path, body) in [
        (
            "/api/chat",
            json!({"model": "m", "stream": false, "options": {"num_predict": 4}, "messages": [
                {"role": "user", "content": "what?", "images": [b64(&picture)]}]}),
        ),
        (
            "/api/generate",
            json!({"model": "m", "stream": false, "options": {"num_predict": 4},
                   "prompt": "what?", "images": [b64(&picture)]}),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "max_output_tokens": 4, "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "what?"},
                {"type": "input_image", "image_url": data_url(&picture)}]}]}),
        ),
    ] {
        let (status, answer) = server.post(path, &body).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    server.stop().await;

    // The same checkpoint opened with --no-vision: images are refused by name.
    let dir = demo_copy(|_, _| {});
    let options = spindle_cpu::LoadOptions {
        no_vision: true,
        ..Default::default()
    };
    let (model, _) = open_model(Some(dir.path()), None, &options).unwrap();
    let server = TestServer::start_with(model, "no-vision".into(), |_| {}).await;
    let (status, body) = server
        .post("/v1/chat/completions", &openai_image(&data_url(&picture)))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(error(&body).1.contains("--no-vision"), "{body}");
    // Text without images still generates on the same model.
    let (status, body) = server
        .post(
            "/v1/chat/completions",
            &json!({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn unreadable_images_and_stray_pads_are_refused_by_name() {
    let (model, id) = vision_demo();
    let server = TestServer::start_with(model, id, |_| {}).await;
    // Valid base64, not an image.
    let (status, body) = server
        .post(
            "/v1/chat/completions",
            &openai_image("data:image/png;base64,aGVsbG8gd29ybGQ="),
        )
        .await;
    assert_eq!(status, 400);
    let (param, message) = error(&body);
    assert_eq!(param, "messages[0].content[1].image_url.url");
    assert!(message.contains("not PNG, JPEG, WebP or GIF"), "{message}");
    // A truncated PNG.
    let mut broken = png(64, 64);
    broken.truncate(broken.len() / 2);
    let (status, body) = server
        .post("/v1/chat/completions", &openai_image(&data_url(&broken)))
        .await;
    assert_eq!(status, 400);
    assert!(error(&body).1.contains("could not be decoded"), "{body}");
    // Aspect ratio above 200.
    let (status, body) = server
        .post(
            "/v1/chat/completions",
            &openai_image(&data_url(&png(1, 300))),
        )
        .await;
    assert_eq!(status, 400);
    assert!(error(&body).1.contains("aspect ratio"), "{body}");
    // A raw prompt holding the image placeholder but no image.
    let (status, body) = server
        .post(
            "/v1/completions",
            &json!({"model": "m", "max_tokens": 2,
                    "prompt": "<|vision_start|><|image_pad|><|vision_end|>describe"}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(error(&body).1.contains("1 image placeholders"), "{body}");
    // Images are read in user messages only.
    let (status, body) = server
        .post(
            "/v1/chat/completions",
            &json!({"model": "m", "messages": [
                {"role": "system", "content": [{"type": "image_url", "image_url": {"url": data_url(&png(64, 64))}}]},
                {"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(error(&body).0, "messages[0].content[0].image_url.url");
    server.stop().await;
}
