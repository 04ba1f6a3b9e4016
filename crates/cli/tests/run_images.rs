//! `spindle run --image FILE`: the image is read and prepared for a model with image input,
//! refused by name everywhere else. The engine does not run the vision tower yet, so a run
//! with images stops at the one place prompts are handed to it, after its pads are counted.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};
use spindle_runtime::demo_dir;
use spindle_testkit::fixtures;

fn spindle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The demo checkpoint with image input declared (`vision_config`, `image_token_id` 4075 =
/// its tokenizer's `<|image_pad|>`, processor bounds 4096..262144 pixels).
fn vision_demo(dir: &Path) {
    for entry in std::fs::read_dir(demo_dir().unwrap()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["image_token_id"] = json!(4075);
    config["vision_config"] = json!({"patch_size": 16, "temporal_patch_size": 2,
        "spatial_merge_size": 2, "in_channels": 3});
    std::fs::write(&path, config.to_string()).unwrap();
    std::fs::write(
        dir.join("preprocessor_config.json"),
        json!({"size": {"shortest_edge": 4096, "longest_edge": 262144}}).to_string(),
    )
    .unwrap();
}

#[test]
fn run_image_is_prepared_and_its_pads_counted() {
    let tmp = tempfile::tempdir().unwrap();
    vision_demo(tmp.path());
    // 75x100 RGBA: smart_resize within 4096..262144 pixels gives 64x96, grid 4x6, 6 tokens.
    let image = fixtures().join("vision_preprocess").join("rgba.png");
    let out = spindle()
        .arg("run")
        .arg("--model")
        .arg(tmp.path())
        .arg("--image")
        .arg(&image)
        .args(["--max-tokens", "2", "What is this?"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    // The demo declares image input but has no tower: the engine refuses by name after the
    // image was prepared and its 6 pads placed.
    assert!(err.contains("holds no vision tower"), "{err}");
    assert!(err.contains("6 image tokens were placed"), "{err}");
    // Two images: 6 + 6 pads.
    let out = spindle()
        .arg("run")
        .arg("--model")
        .arg(tmp.path())
        .arg("--image")
        .arg(&image)
        .arg("--image")
        .arg(&image)
        .args(["--max-tokens", "2", "Compare them."])
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("12 image tokens were placed"),
        "{}",
        stderr(&out)
    );
    // Without --image the same model still answers.
    let out = spindle()
        .arg("run")
        .arg("--model")
        .arg(tmp.path())
        .args(["--max-tokens", "2", "hi"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn run_image_refusals_name_the_problem() {
    let image = fixtures().join("vision_preprocess").join("rgba.png");
    // The demo is text only.
    let out = spindle()
        .arg("run")
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
    let tmp = tempfile::tempdir().unwrap();
    vision_demo(tmp.path());
    let not_image = tmp.path().join("notes.png");
    std::fs::write(&not_image, "just text").unwrap();
    let out = spindle()
        .arg("run")
        .arg("--model")
        .arg(tmp.path())
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
