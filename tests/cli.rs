//! End-to-end: the real `glidefs` binary starts and answers `--version` and `--help`.

use std::process::Command;

const GLIDEFS: &str = env!("CARGO_BIN_EXE_glidefs");

#[test]
fn version_and_help() {
    let out = Command::new(GLIDEFS)
        .arg("--version")
        .output()
        .expect("run glidefs --version");
    assert!(out.status.success(), "glidefs --version failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        format!("glidefs {}", env!("CARGO_PKG_VERSION"))
    );

    let out = Command::new(GLIDEFS)
        .arg("--help")
        .output()
        .expect("run glidefs --help");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("features"));
}

#[test]
fn unknown_subcommand_is_a_usage_error() {
    let out = Command::new(GLIDEFS)
        .arg("no-such-command")
        .output()
        .expect("run glidefs");
    assert_eq!(
        out.status.code(),
        Some(2),
        "clap usage errors exit 2: {out:?}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-command"));
}
