//! Kernel test: read the ublk feature bits from `/dev/ublk-control`.
//!
//! Needs a kernel with ublk (run through `scripts/ublk-vm`); ignored in plain `cargo test`.

use ublk_core::features::{kernel_release, KernelFeatures};

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_control_reports_zero_copy_and_user_copy() {
    let features = KernelFeatures::probe().expect("probe ublk features");
    println!(
        "kernel {}: ublk features {features} (BATCH_IO: {})",
        kernel_release(),
        features.batch_io()
    );
    assert!(
        features.has(libublk::sys::UBLK_F_SUPPORT_ZERO_COPY as u64),
        "SUPPORT_ZERO_COPY missing"
    );
    assert!(
        features.has(libublk::sys::UBLK_F_AUTO_BUF_REG as u64),
        "AUTO_BUF_REG missing"
    );
    assert!(features.user_copy(), "USER_COPY missing");
    assert!(features.user_recovery(), "USER_RECOVERY missing");
}
