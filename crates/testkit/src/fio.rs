//! fio for the kernel tests: a run against a device that fails the test on any error (exit
//! status, a job's error, a job that wrote or verified nothing, a verify complaint).

use std::process::Command;

/// Runs fio with `args` against `dev` (O_DIRECT, io_uring, JSON output) and fails on any
/// error (see the module docs); prints what each job read and wrote.
pub fn fio(dev: &str, args: &[&str]) {
    let out = Command::new("fio")
        .arg(format!("--filename={dev}"))
        .args([
            "--direct=1",
            "--ioengine=io_uring",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .args(args)
        .output()
        .expect("running fio");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "fio {args:?} failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    let json: serde_json::Value = serde_json::from_str(&stdout[stdout.find('{').unwrap_or(0)..])
        .unwrap_or_else(|e| panic!("fio json: {e}\n{stdout}"));
    for job in json["jobs"].as_array().expect("fio jobs") {
        let name = job["jobname"].as_str().unwrap_or("?");
        let err = job["error"].as_i64().unwrap_or(-1);
        let rd = job["read"]["io_bytes"].as_u64().unwrap_or(0);
        let wr = job["write"]["io_bytes"].as_u64().unwrap_or(0);
        println!("fio job {name}: error={err} read={rd} B written={wr} B");
        assert_eq!(err, 0, "fio job {name} reported error {err}");
        assert!(wr > 0, "fio job {name} wrote nothing");
        assert!(rd > 0, "fio job {name} read (verified) nothing");
    }
    assert!(
        !stderr.contains("verify:"),
        "fio reported verify problems:\n{stderr}"
    );
}
