//! End-to-end tests for glidefs live in `tests/tests/`: they drive the real `glidefs`
//! binary, and (the `ublk_*` ones, under a ublk-capable kernel) real `/dev/ublkbN` devices.
//! This library holds their shared helpers.

use std::path::PathBuf;

/// Path of the `glidefs` binary built by cargo for this workspace.
pub fn glidefs_bin() -> PathBuf {
    let mut dir = std::env::current_exe().expect("test executable path");
    dir.pop(); // deps/
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join("glidefs")
}
