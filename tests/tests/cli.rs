//! The binary starts and answers `--version` and `--help`.

use std::process::Command;

#[test]
fn version_and_help() {
    let bin = glidefs_e2e::glidefs_bin();
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .expect("run glidefs --version");
    assert!(out.status.success(), "{bin:?} --version failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("glidefs "),
        "unexpected version line: {text}"
    );

    let out = Command::new(&bin)
        .arg("--help")
        .output()
        .expect("run glidefs --help");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("features"));
}
