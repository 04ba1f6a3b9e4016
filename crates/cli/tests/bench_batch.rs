//! The measurement tools of continuous batching on the demo model: `spindle bench --batch`
//! (batched decode at each B beside B=1) and `spindle bench --serve` (the load generator,
//! against a `spindle serve` process).

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn spindle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .env_remove("SPINDLE_API_KEY")
        .output()
        .expect("cannot run the spindle binary")
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn bench_batch_reports_each_size_beside_batch_1() {
    let out = spindle(&[
        "bench", "--batch", "3", "--gen", "2", "--runs", "1", "--json",
    ]);
    let v = json_of(&out);
    let rows = v["batched_decode"].as_array().unwrap();
    let sizes: Vec<u64> = rows.iter().map(|r| r["batch"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [1, 3]);
    assert_eq!(rows[0]["vs_batch_1"], 1.0);
    for r in rows {
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["step_ms"].as_f64().unwrap() > 0.0, "{r}");
    }
    // The demo has a tokenizer: the same decode through the scheduler is measured too.
    let scheduled = v["scheduler_decode"].as_array().unwrap();
    let sizes: Vec<u64> = scheduled
        .iter()
        .map(|r| r["batch"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [1, 3]);
    for r in scheduled {
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["generated"].as_u64().unwrap() > 0, "{r}");
    }
}

#[test]
fn bench_serve_load_generates_against_a_running_server() {
    let mut server = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "--port", "0", "--parallel", "2"])
        .env_remove("SPINDLE_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start the spindle binary");
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    let out = spindle(&[
        "bench",
        "--serve",
        &url,
        "--clients",
        "1,2",
        "--prompt-words",
        "20",
        "--max-tokens",
        "8",
        "--requests",
        "1",
        "--json",
    ]);
    let _ = server.kill();
    let _ = server.wait();
    let v = json_of(&out);
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for (r, clients) in results.iter().zip([1, 2]) {
        assert_eq!(r["clients"], clients);
        assert_eq!(r["requests"], clients);
        assert_eq!(r["failed"], 0, "{r}");
        let tokens = r["completion_tokens"].as_u64().unwrap();
        assert!(tokens > 0 && tokens <= 8 * clients, "{r}");
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0);
    }
}
