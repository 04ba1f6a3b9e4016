//! `spindle run --image FILE`: the embedded demo carries a tiny vision tower, so an image is
//! read, prepared, encoded and answered out of the box; models without image input, `--raw`
//! and unreadable files are refused by name.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use spindle_runtime::demo_dir;
use spindle_testkit::fixtures;

fn spindle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The prompt size from the run's closing line `[prompt: N tokens, ...`.
fn prompt_tokens(out: &Output) -> usize {
    let err = stderr(out);
    let rest = err
        .split("[prompt: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no prompt line in {err}"));
    rest.split(' ').next().unwrap().parse().unwrap()
}

/// The demo checkpoint without image input: no `vision_config`, no image token ids.
fn text_only_demo(dir: &Path) {
    for entry in std::fs::read_dir(demo_dir().unwrap()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let obj = config.as_object_mut().unwrap();
    for key in ["vision_config", "image_token_id", "video_token_id"] {
        obj.remove(key);
    }
    std::fs::write(&path, config.to_string()).unwrap();
}

#[test]
fn run_image_answers_on_the_demo() {
    // 75x100 RGBA: smart_resize with the released bounds (min 65536 pixels) gives 224x320,
    // grid 14x20, 70 image tokens, plus <|vision_start|> and <|vision_end|>.
    let image = fixtures().join("vision_preprocess").join("rgba.png");
    let run = |images: usize, text: &str| {
        let mut cmd = spindle();
        cmd.arg("run");
        for _ in 0..images {
            cmd.arg("--image").arg(&image);
        }
        cmd.args(["--max-tokens", "2", text]).output().unwrap()
    };
    let text = run(0, "What is this?");
    assert!(text.status.success(), "{}", stderr(&text));
    let one = run(1, "What is this?");
    assert!(one.status.success(), "{}", stderr(&one));
    assert!(!one.stdout.is_empty(), "an answer is printed");
    assert_eq!(prompt_tokens(&one), prompt_tokens(&text) + 70 + 2);
    let two = run(2, "What is this?");
    assert!(two.status.success(), "{}", stderr(&two));
    assert_eq!(prompt_tokens(&two), prompt_tokens(&text) + 2 * (70 + 2));
    // --no-vision leaves the tower out: the image is refused by name.
    let out = spindle()
        .args(["run", "--no-vision", "--image"])
        .arg(&image)
        .arg("hi")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--no-vision") && err.contains("70 image tokens were placed"),
        "{err}"
    );
}

#[test]
fn run_image_refusals_name_the_problem() {
    let image = fixtures().join("vision_preprocess").join("rgba.png");
    // A text-only model.
    let tmp = tempfile::tempdir().unwrap();
    text_only_demo(tmp.path());
    let out = spindle()
        .arg("run")
        .arg("--model")
        .arg(tmp.path())
        .arg("--image")
        .arg(&image)
        .arg("hi")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("has no vision tower"),
        "{}",
        stderr(&out)
    );
    // Not with --raw; not without a prompt.
    let out = spindle()
        .arg("run")
        .arg("--raw")
        .arg("--image")
        .arg(&image)
        .arg("hi")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--raw"), "{}", stderr(&out));
    // A file that is not an image, on a model that reads images.
    let not_image = tmp.path().join("notes.png");
    std::fs::write(&not_image, "just text").unwrap();
    let out = spindle()
        .arg("run")
        .arg("--image")
        .arg(&not_image)
        .arg("hi")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("notes.png") && err.contains("not PNG, JPEG, WebP or GIF"),
        "{err}"
    );
}
