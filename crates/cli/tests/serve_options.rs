//! `spindle serve` refuses bad options by name before it loads anything.

use std::process::Command;

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
