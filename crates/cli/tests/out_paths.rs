//! Output paths (issue 17, item 6): `logits --out`, `synth --out` and `convert`'s destination
//! replace only regular files, never a symlink, FIFO or device, and never write inside the
//! model directory being read.

use std::path::Path;
use std::process::{Command, Output};

use spindle_testkit::copy_fixture;

fn spindle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .output()
        .expect("cannot start the spindle binary")
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn assert_refused(output: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "succeeded: {stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in: {stderr}");
}

fn logits(model: &Path, out: &Path) -> Output {
    spindle(&[
        "logits",
        "--model",
        p(model),
        "--tokens",
        "1,2,3",
        "--out",
        p(out),
        "--device",
        "cpu",
    ])
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

#[test]
fn logits_out_refuses_the_models_own_files_symlinks_and_fifos() {
    let model = copy_fixture("qwen3_5_dense");
    let weights = model.path().join("model.safetensors");
    let before = std::fs::read(&weights).unwrap();
    assert_refused(
        &logits(model.path(), &weights),
        "inside the model directory",
    );
    assert_eq!(std::fs::read(&weights).unwrap(), before);

    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::write(&target, b"keep").unwrap();
    let link = tmp.path().join("link.safetensors");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert_refused(&logits(model.path(), &link), "symlink");
    assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");

    let fifo = tmp.path().join("fifo");
    mkfifo(&fifo);
    assert_refused(&logits(model.path(), &fifo), "a FIFO");
    use std::os::unix::fs::FileTypeExt;
    assert!(fifo.symlink_metadata().unwrap().file_type().is_fifo());

    assert_refused(
        &logits(model.path(), Path::new("/dev/null")),
        "character device",
    );
    assert_refused(&logits(model.path(), tmp.path()), "a directory");

    // A regular file is replaced.
    let out = tmp.path().join("out.safetensors");
    std::fs::write(&out, b"old").unwrap();
    let output = logits(model.path(), &out);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_ne!(std::fs::read(&out).unwrap(), b"old");
}

#[test]
fn synth_and_convert_refuse_symlinks_and_the_model_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), &link).unwrap();
    let synth = spindle(&["synth", "--shape", "demo", "--out", p(&link)]);
    assert_refused(&synth, "symlink");

    let model = copy_fixture("qwen3_5_moe");
    let inside = model.path().join("install");
    let convert = spindle(&["convert", p(model.path()), p(&inside)]);
    assert_refused(&convert, "inside the model directory");
    assert!(!inside.exists());
    assert_refused(&spindle(&["convert", p(model.path()), p(&link)]), "exists");
}
