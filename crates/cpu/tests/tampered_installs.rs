//! Tampered installs (issue 17, items 3 and 4): a manifest whose paths point outside the
//! install, or whose numbers disagree with the config or the file sizes, is refused by the
//! manifest field at fault, at open, never loaded and never a panic.

mod common;

use std::path::{Path, PathBuf};

use common::{copy_dir, fixture, TempDir};
use serde_json::Value;
use spindle_cpu::{Engine, LoadOptions};
use spindle_model::experts::ExpertResidency;
use spindle_model::install::{self, Verify};
use spindle_model::quant::WeightFormat;

/// One pristine q8 install of the MoE fixture, copied per case.
struct Installs {
    tmp: TempDir,
    pristine: PathBuf,
}

impl Installs {
    fn new(tag: &str) -> Self {
        let tmp = TempDir::new(&format!("tampered-{tag}"));
        let pristine = tmp.0.join("pristine");
        install::convert(
            &fixture("qwen3_5_moe"),
            &pristine,
            WeightFormat::Q8,
            &mut |_| true,
        )
        .unwrap();
        Installs { tmp, pristine }
    }

    /// A copy named `tag` whose manifest is changed by `edit`.
    fn tampered(&self, tag: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
        let dir = self.tmp.0.join(tag);
        copy_dir(&self.pristine, &dir);
        let path = dir.join(install::MANIFEST);
        let mut manifest: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut manifest);
        std::fs::write(&path, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
        dir
    }
}

/// The load error of `dir` under every residency and verification (each must refuse it).
fn refusal(dir: &Path) -> String {
    let mut first = None;
    for experts in [
        ExpertResidency::Resident,
        ExpertResidency::Mapped,
        ExpertResidency::Streamed,
    ] {
        for verify in [Verify::Sizes, Verify::Full] {
            let options = LoadOptions {
                experts,
                verify,
                ..Default::default()
            };
            match Engine::load_with(dir, &options) {
                Ok(_) => panic!("{} loaded ({experts:?}, {verify:?})", dir.display()),
                Err(e) => {
                    first.get_or_insert(e.to_string());
                }
            }
        }
    }
    first.unwrap()
}

fn assert_mentions(err: &str, words: &[&str]) {
    for w in words {
        assert!(err.contains(w), "{w:?} not in: {err}");
    }
}

#[test]
fn manifest_paths_outside_the_install_are_refused() {
    let installs = Installs::new("paths");
    let outside = installs.tmp.0.join("outside.bin");
    std::fs::copy(installs.pristine.join("experts/layer-001.bin"), &outside).unwrap();

    for (field, value) in [
        ("experts[0].file", "/etc/passwd"),
        ("experts[0].file", "../outside.bin"),
        ("experts[0].file", "experts/../../outside.bin"),
        ("resident.file", "../pristine/model.safetensors"),
        ("resident.file", "/etc/passwd"),
    ] {
        let dir = installs.tampered("abs", |m| {
            let slot = match field {
                "resident.file" => &mut m["resident"]["file"],
                _ => &mut m["experts"][0]["file"],
            };
            *slot = value.into();
        });
        assert_mentions(&refusal(&dir), &[field, value, "inside the install"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // A file inside the install but not in files[] would escape --verify.
    let dir = installs.tampered("unlisted", |m| {
        m["experts"][0]["file"] = "experts/copy.bin".into();
    });
    std::fs::copy(
        dir.join("experts/layer-001.bin"),
        dir.join("experts/copy.bin"),
    )
    .unwrap();
    assert_mentions(
        &refusal(&dir),
        &[
            "experts[0].file",
            "experts/copy.bin",
            "not listed in files[]",
        ],
    );

    // A listed file that is a symlink out of the install.
    let dir = installs.tampered("symlink", |_| {});
    let layer = dir.join("experts/layer-001.bin");
    std::fs::remove_file(&layer).unwrap();
    std::os::unix::fs::symlink(&outside, &layer).unwrap();
    assert_mentions(&refusal(&dir), &["layer-001.bin", "outside the install"]);

    // A listed file that is a FIFO would hang a read.
    let dir = installs.tampered("fifo", |_| {});
    let generation = dir.join("generation_config.json");
    std::fs::remove_file(&generation).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(&generation)
        .status()
        .unwrap();
    assert!(status.success());
    assert_mentions(&refusal(&dir), &["generation_config.json", "a FIFO"]);

    // --verify writes its receipt as a new file: a planted symlink is replaced, not followed.
    let dir = installs.tampered("receipt", |_| {});
    let victim = installs.tmp.0.join("victim.txt");
    std::fs::write(&victim, b"keep").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join(install::RECEIPT)).unwrap();
    let options = LoadOptions {
        verify: Verify::Full,
        ..Default::default()
    };
    Engine::load_with(&dir, &options).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    assert!(dir
        .join(install::RECEIPT)
        .symlink_metadata()
        .unwrap()
        .is_file());

    // The pristine install still loads.
    Engine::load_with(&installs.pristine, &LoadOptions::default()).unwrap();
}

/// A change to a manifest's JSON.
type Edit = Box<dyn Fn(&mut Value)>;

#[test]
fn manifest_numbers_disagreeing_with_the_config_are_refused() {
    let installs = Installs::new("numbers");
    let cases: Vec<(&str, Edit, Vec<&str>)> = vec![
        (
            "experts",
            Box::new(|m| m["experts"][0]["experts"] = 4.into()),
            vec!["experts[0].experts is 4", "num_experts is"],
        ),
        (
            "experts-huge",
            Box::new(|m| m["experts"][0]["experts"] = (1u64 << 40).into()),
            vec!["experts[0].experts is 1099511627776", "num_experts is"],
        ),
        (
            "swapped",
            Box::new(|m| {
                let part = &mut m["experts"][0]["parts"][0];
                let rows = part["rows"].clone();
                part["rows"] = part["cols"].clone();
                part["cols"] = rows;
            }),
            vec!["experts[0].parts[0]", "weight schema"],
        ),
        (
            "stride",
            Box::new(|m| m["experts"][0]["stride"] = (1u64 << 62).into()),
            vec!["experts[0]", "stride 4611686018427387904", "files[] gives"],
        ),
        (
            "stride-small",
            Box::new(|m| m["experts"][0]["stride"] = 4096.into()),
            vec!["experts[0]", "runs past experts[0].stride 4096"],
        ),
        (
            "offset-overflow",
            Box::new(|m| m["experts"][0]["parts"][1]["scales_offset"] = (u64::MAX - 63).into()),
            vec!["experts[0].parts[1]", "scales_offset 18446744073709551552"],
        ),
        (
            "rows-overflow",
            Box::new(|m| m["experts"][0]["parts"][2]["rows"] = (1u64 << 62).into()),
            vec!["experts[0].parts[2]", "too large"],
        ),
        (
            "format-case",
            Box::new(|m| m["experts"][0]["parts"][0]["format"] = "Q8".into()),
            vec!["experts[0].parts[0]", "format \"Q8\""],
        ),
        (
            "layer",
            Box::new(|m| m["experts"][0]["layer"] = 999.into()),
            vec!["experts[0].layer 999 is not a MoE layer"],
        ),
        (
            "missing-layer",
            Box::new(|m| {
                m["experts"].as_array_mut().unwrap().remove(0);
            }),
            vec!["is a MoE layer in config.json but experts[] has no entry"],
        ),
    ];
    for (tag, edit, words) in cases {
        let dir = installs.tampered(tag, edit);
        assert_mentions(&refusal(&dir), &words);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
