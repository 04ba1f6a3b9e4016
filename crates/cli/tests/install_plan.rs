//! The memory plan `spindle inspect` prints against the peak RSS (VmHWM) `spindle bench`
//! measures in its own process, on a small synthetic install (a narrowed Qwen3.6-35B-A3B).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use spindle_model::install;
use spindle_model::quant::WeightFormat;
use spindle_model::synth::{shape_config, truncate_layers, without_vision, write_checkpoint};

fn spindle_json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .output()
        .expect("cannot start spindle");
    assert!(
        out.status.success(),
        "spindle {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("spindle {args:?}: {e}"))
}

/// A 2-layer A3B-shaped checkpoint narrowed to about 0.5 GB (bf16), converted to q8; text
/// only (the released tower would not fit the narrowed width, and is read only for images).
fn small_install(root: &Path) -> PathBuf {
    let mut config = shape_config("qwen3.6-35b-a3b").unwrap();
    truncate_layers(&mut config, 2);
    without_vision(&mut config);
    for (k, v) in [
        ("hidden_size", 1024),
        ("vocab_size", 32768),
        ("num_experts", 64),
        ("eos_token_id", 1),
    ] {
        config[k] = json!(v);
    }
    let src = root.join("synth");
    write_checkpoint(&src, &config, 7, 1 << 30, &mut |_| {}).unwrap();
    let dst = root.join("install");
    install::convert(&src, &dst, WeightFormat::Q8, &mut |_| true).unwrap();
    std::fs::remove_dir_all(&src).unwrap();
    dst
}

fn within(measured: f64, planned: f64, what: &str) {
    let error = (measured - planned).abs() / measured;
    println!(
        "{what}: planned {:.1} MB, measured {:.1} MB ({:+.1}%)",
        planned / 1e6,
        measured / 1e6,
        (planned / measured - 1.0) * 100.0
    );
    assert!(
        error <= 0.15,
        "{what}: planned {planned} bytes, measured peak RSS {measured} ({:.1}% off)",
        error * 100.0
    );
}

#[test]
fn the_memory_plan_predicts_peak_rss_within_15_percent() {
    let root = std::env::temp_dir().join(format!("spindle-plan-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = small_install(&root);
    let dir_s = dir.to_str().unwrap();
    let (prompt, gen) = (32, 8);
    let context = (prompt + gen).to_string();
    let plan =
        spindle_json(&["inspect", dir_s, "--json", "--context", &context])["memory_plan"].clone();
    let bench = |experts: &str, slots: Option<usize>| {
        let (p, g) = (prompt.to_string(), gen.to_string());
        let mut args = vec![
            "bench",
            "--model",
            dir_s,
            "--experts",
            experts,
            "--prompt",
            &p,
            "--gen",
            &g,
            "--runs",
            "1",
            "--probe-mib",
            "1",
            "--json",
        ];
        let slots = slots.map(|s| s.to_string());
        if let Some(s) = &slots {
            args.extend(["--expert-slots", s]);
        }
        spindle_json(&args)["peak_rss_bytes"].as_f64().unwrap()
    };
    within(
        bench("resident", None),
        plan["peak_rss_bytes"]["resident"].as_f64().unwrap(),
        "resident",
    );
    let streamed = &plan["peak_rss_bytes"]["streamed"][1];
    let slots = streamed["slots"].as_u64().unwrap() as usize;
    within(
        bench("streamed", Some(slots)),
        streamed["peak_rss_bytes"].as_f64().unwrap(),
        &format!("streamed, {slots} slots"),
    );
    std::fs::remove_dir_all(&root).unwrap();
}
