//! The `wasmbox run` command, as a user types it.

use crate::common;

use std::process::Command;

use common::*;

#[test]
fn run_prints_output_and_exits_with_guest_code() {
    prepare();
    let out = Command::new(BIN)
        .args(["run", "--language", "python", "--code", "print(6*7)"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
    assert_eq!(out.status.code(), Some(0));
    let out = Command::new(BIN)
        .args(["run", "--code", "import sys; sys.exit(7)"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
}

#[test]
fn run_json_and_stdin() {
    prepare();
    let mut child = Command::new(BIN)
        .args(["run", "--json", "--code", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"print('from stdin')\n1/0\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stdout"], "from stdin\n");
    assert_eq!(v["exit_code"], 1);
    assert!(v["stderr"].as_str().unwrap().contains("ZeroDivisionError"));
}

#[test]
fn run_with_missing_runtimes_says_how_to_fix() {
    let out = Command::new(BIN)
        .args(["run", "--code", "print(1)"])
        .env("WASMBOX_RUNTIMES", "/nonexistent/runtimes")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fetch-runtimes.sh"), "{err}");
}
