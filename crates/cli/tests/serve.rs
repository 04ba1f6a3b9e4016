//! `spindle serve` as a process: bad options refused by name before anything is loaded, and
//! a server under a small descriptor limit that idle connections cannot lock out.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `spindle serve --port 0` on the demo model under `ulimit -n descriptors`; returns the
/// process and its `host:port`.
fn serve_with_descriptor_limit(descriptors: u32) -> (Child, String) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n {descriptors} && exec \"$0\" serve --port 0"
        ))
        .arg(env!("CARGO_BIN_EXE_spindle"))
        .env_remove("SPINDLE_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start the spindle binary");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    (child, addr)
}

/// `GET /health` on a fresh connection; the status line and how long the answer took.
fn health(addr: &str) -> (String, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer.lines().next().unwrap_or("").to_owned();
    (status, started.elapsed())
}

/// Issue 17: under a 256-descriptor limit, 300 idle connections made `/health` time out.
#[test]
fn idle_connections_beyond_the_descriptor_limit_do_not_lock_out_health() {
    let (mut child, addr) = serve_with_descriptor_limit(256);
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    for _ in 0..3 {
        let (status, took) = health(&addr);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(took < Duration::from_secs(1), "/health took {took:?}");
    }
    // SIGTERM with the idle connections still open: a clean, prompt exit.
    let stopped = Instant::now();
    let killed = Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(stopped.elapsed() < Duration::from_secs(5));
    drop(idle);
}

#[test]
fn an_empty_spindle_api_key_is_refused_by_its_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "--port", "0"])
        .env("SPINDLE_API_KEY", "")
        .output()
        .expect("cannot start the spindle binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("SPINDLE_API_KEY is set but empty"),
        "{stderr}"
    );
    assert!(!stderr.contains("--api-key"), "{stderr}");
}

#[test]
fn zero_timeouts_are_refused() {
    for flag in ["--header-timeout", "--body-timeout"] {
        let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(["serve", "--port", "0", flag, "0"])
            .env_remove("SPINDLE_API_KEY")
            .output()
            .expect("cannot start the spindle binary");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(flag), "{stderr}");
    }
}
