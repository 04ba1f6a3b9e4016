//! `--device` of `run` and `serve` end to end: refused by name in a build without the CUDA
//! backend; in a build with it, CPU-only options are refused by name, a machine without CUDA
//! fails fast with the backend's "CUDA is not available" message, and a machine with a GPU
//! generates what the CPU generates.

use std::path::Path;
use std::process::{Command, Output};

use spindle_testkit::fixture;

fn spindle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .output()
        .expect("cannot start the spindle binary")
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_fails_naming(args: &[&str], needles: &[&str]) -> Output {
    let output = spindle(args);
    assert!(!output.status.success(), "{args:?} succeeded");
    let err = stderr(&output);
    for needle in needles {
        assert!(
            err.contains(needle),
            "{args:?}: stderr lacks {needle:?}:\n{err}"
        );
    }
    output
}

#[test]
fn run_and_serve_document_the_device_option() {
    for command in ["run", "serve"] {
        let out = spindle(&[command, "--help"]);
        assert!(out.status.success());
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains("--device") && help.contains("cuda:N"),
            "{command} --help:\n{help}"
        );
    }
}

#[test]
fn unknown_devices_are_refused_listing_the_available_ones() {
    assert_fails_naming(
        &["run", "--device", "tpu", "hello"],
        &["\"tpu\"", "available devices: cpu"],
    );
    assert_fails_naming(
        &["serve", "--device", "tpu", "--port", "0"],
        &["\"tpu\"", "available devices: cpu"],
    );
}

/// Without the `cuda` feature, `cuda[:N]` is refused at argument parsing, naming the feature.
#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_cuda_feature_run_and_serve_refuse_cuda_naming_the_feature() {
    let dir = fixture("qwen3_5_moe");
    for args in [
        vec!["run", "--device", "cuda", "--model", p(&dir), "hello"],
        vec!["run", "--device", "cuda:1", "hello"],
        vec!["serve", "--device", "cuda", "--port", "0"],
        vec![
            "serve",
            "--device",
            "cuda:0",
            "--model",
            p(&dir),
            "--port",
            "0",
        ],
        vec!["bench", "--device", "cuda", "--gen", "1"],
    ] {
        let out = assert_fails_naming(
            &args,
            &[
                "without the CUDA backend",
                "--features cuda",
                "available devices: cpu",
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{args:?}: a usage error");
        assert!(out.stdout.is_empty(), "{args:?}: nothing is served or run");
    }
}

/// Whether this machine can run CUDA at all (a driver and NVRTC), asked of the backend.
#[cfg(feature = "cuda")]
fn cuda_present() -> bool {
    let load = spindle_runtime::Backend::load(
        Path::new("/no/such/model"),
        spindle_runtime::Device::Cuda(0),
        &spindle_cpu::LoadOptions::default(),
    );
    !matches!(load, Err(e) if e.is_cuda_unavailable())
}

/// Options only the CPU engine has are refused by name before any device is opened, so these
/// hold with or without a GPU.
#[cfg(feature = "cuda")]
#[test]
fn cuda_refuses_cpu_only_options_by_name() {
    let dir = fixture("qwen3_5_moe");
    assert_fails_naming(
        &[
            "run",
            "--device",
            "cuda",
            "--model",
            p(&dir),
            "--experts",
            "streamed",
            "hello",
        ],
        &["--experts streamed", "--device cpu"],
    );
    assert_fails_naming(
        &[
            "serve",
            "--device",
            "cuda:0",
            "--model",
            p(&dir),
            "--expert-slots",
            "4",
            "--port",
            "0",
        ],
        &["--expert-slots 4", "--device cpu"],
    );
    let install = tempfile::tempdir().unwrap();
    std::fs::write(install.path().join("manifest.json"), "{}").unwrap();
    assert_fails_naming(
        &[
            "run",
            "--device",
            "cuda",
            "--model",
            p(install.path()),
            "hello",
        ],
        &["spindle install", "Hugging Face checkpoints only"],
    );
    assert_fails_naming(
        &["run", "--device", "cuda:x", "hello"],
        &["\"x\"", "not a CUDA device number"],
    );
}

/// No driver: `run` and `serve` fail at once with the backend's message (before reading the
/// weights, the tokenizer or binding a port).
#[cfg(feature = "cuda")]
#[test]
fn without_a_driver_run_and_serve_fail_fast_with_a_clear_error() {
    if cuda_present() {
        return; // a machine with a driver cannot show this; `with_a_gpu_run_matches_the_cpu` runs there
    }
    let dir = fixture("qwen3_5_moe");
    for args in [
        vec!["run", "--device", "cuda", "--model", p(&dir), "hello"],
        vec!["run", "--device", "cuda:1", "--max-tokens", "4", "hello"],
        vec![
            "serve",
            "--device",
            "cuda",
            "--model",
            p(&dir),
            "--port",
            "0",
        ],
        vec!["serve", "--device", "cuda:0", "--port", "0"],
    ] {
        let started = std::time::Instant::now();
        let out = assert_fails_naming(&args, &["CUDA is not available", "--device cpu"]);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("spindle serve:"),
            "{args:?}: the server must not start"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}

/// On a GPU machine: the demo generates the same greedy text on CUDA as on the CPU.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn with_a_gpu_run_matches_the_cpu() {
    assert!(cuda_present(), "no CUDA driver or GPU on this machine");
    let run = |device: &str| {
        let out = spindle(&[
            "run",
            "--device",
            device,
            "--temperature",
            "0",
            "--max-tokens",
            "16",
            "Tell me about rivers.",
        ]);
        assert!(out.status.success(), "--device {device}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let cpu = run("cpu");
    assert!(!cpu.trim().is_empty());
    assert_eq!(run("cuda"), cpu);
}
