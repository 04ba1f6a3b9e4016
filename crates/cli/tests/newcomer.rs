//! What a new user meets first, with the embedded demo (issue 17, point 11): an empty
//! prompt, the statistics line, the bench's model name and peak RSS, and `inspect --context`
//! arithmetic.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn spindle(args: &[&str]) -> Output {
    spindle_with(args, &[], None)
}

/// Runs the binary with `env` set and `stdin` piped in (empty stdin when `None`).
fn spindle_with(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start the spindle binary");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn run_refuses_an_empty_prompt() {
    for (args, stdin) in [
        (vec!["run", ""], None),
        (vec!["run", "  \n"], None),
        (vec!["run", "--raw", ""], None),
        (vec!["run"], Some("")),
    ] {
        let out = spindle_with(&args, &[], stdin);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded: {err}");
        assert!(err.contains("the prompt is empty"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} generated text");
    }
}

#[test]
fn run_stats_line_says_why_generation_stopped_in_words() {
    let out = spindle(&["run", "--max-tokens", "2", "hello"]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("stop: token limit reached]"), "{err}");
    assert!(!err.contains("Length") && !err.contains("Eos("), "{err}");
}

#[test]
fn bench_names_the_demo_not_its_cache_directory_and_excludes_the_probe_from_peak_rss() {
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().to_str().unwrap();
    // A 1 GiB probe buffer, as by default: before, peak RSS counted it (1.09 GB reported
    // for the 4.4 MB demo).
    let out = spindle_with(
        &[
            "bench",
            "--prompt",
            "8",
            "--gen",
            "4",
            "--runs",
            "1",
            "--probe-mib",
            "1024",
            "--json",
        ],
        &[("SPINDLE_CACHE_DIR", cache_dir)],
        None,
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !stdout.contains(cache_dir) && !text(&out.stderr).contains(cache_dir),
        "{stdout}"
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["model"], "spindle-demo (embedded)", "{stdout}");
    let peak = report["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        peak > 0 && peak < 512 << 20,
        "peak RSS {peak} includes the bandwidth probe"
    );
}

#[test]
fn inspect_refuses_a_context_whose_memory_plan_overflows() {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo");
    let out = spindle(&["inspect", demo, "--context", &(1u64 << 60).to_string()]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(err.contains("--context 1152921504606846976"), "{err}");
    let out = spindle(&["inspect", demo, "--context", &usize::MAX.to_string()]);
    assert!(!out.status.success());
    // A large but representable context still plans.
    let out = spindle(&["inspect", demo, "--context", "1000000", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
