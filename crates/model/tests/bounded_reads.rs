//! Bounded reads (issue 17, item 8): config.json, model.safetensors.index.json and an
//! install's manifest.json are refused by name when they are FIFOs, devices or over their
//! size cap, at once (no hang, no multi-GB allocation).

use std::path::Path;
use std::process::Command;

use spindle_model::install::{self, Install, Verify};
use spindle_model::quant::WeightFormat;
use spindle_model::{Checkpoint, ModelConfig};
use spindle_testkit::{copy_fixture, fixture};

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

/// Replaces `path` with a sparse file of `len` bytes (no disk used).
fn sparse(path: &Path, len: u64) {
    let _ = std::fs::remove_file(path);
    let file = std::fs::File::create(path).unwrap();
    file.set_len(len).unwrap();
}

fn symlink_to(target: &str, path: &Path) {
    let _ = std::fs::remove_file(path);
    std::os::unix::fs::symlink(target, path).unwrap();
}

#[test]
fn config_and_index_fifos_devices_and_giants_are_refused() {
    let dir = copy_fixture("qwen3_5_moe");
    let config = dir.path().join("config.json");
    mkfifo(&config);
    let err = ModelConfig::from_dir(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("config.json") && err.contains("a FIFO"),
        "{err}"
    );
    symlink_to("/dev/zero", &config);
    let err = ModelConfig::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("character device"), "{err}");
    sparse(&config, spindle_model::fs::CONFIG_LIMIT + 1);
    let err = ModelConfig::from_dir(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("config.json") && err.contains("-byte limit"),
        "{err}"
    );

    let index = dir.path().join("model.safetensors.index.json");
    mkfifo(&index);
    let err = Checkpoint::open(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("index.json") && err.contains("a FIFO"),
        "{err}"
    );
    sparse(&index, spindle_model::fs::INDEX_LIMIT + 1);
    let err = Checkpoint::open(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("index.json") && err.contains("-byte limit"),
        "{err}"
    );
}

#[test]
fn manifest_fifos_and_giants_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("install");
    install::convert(&fixture("qwen3_5_moe"), &dst, WeightFormat::Q8, &mut |_| {
        true
    })
    .unwrap();
    let manifest = dst.join(install::MANIFEST);
    sparse(&manifest, spindle_model::fs::MANIFEST_LIMIT + 1);
    let err = Install::open(&dst, Verify::Sizes)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("manifest.json") && err.contains("-byte limit"),
        "{err}"
    );
    mkfifo(&manifest);
    let err = Install::open(&dst, Verify::Sizes)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("manifest.json") && err.contains("a FIFO"),
        "{err}"
    );
}
