//! Stopping a device only when nothing has it open.
//!
//! A plain STOP_DEV removes `/dev/ublkbN` under a mounted filesystem: its later writes fail
//! and whatever it had not written back is lost. [`stop_if_unused`] refuses instead:
//!
//! - Linux 7.0+ advertises `UBLK_F_SAFE_STOP_DEV` for every device (the driver sets it at
//!   ADD_DEV; nothing to ask for) and answers `UBLK_U_CMD_TRY_STOP_DEV`: under the disk's open
//!   mutex it fails with `EBUSY` when the disk has any opener (a mount, a VM's disk, a `dd`),
//!   and otherwise blocks further opens and stops the device: no check-then-stop race.
//!   libublk 0.4.8 has no call for it, so the command is sent here on a ring of our own.
//! - Older kernels: the block device is opened with `O_EXCL`, which fails with `EBUSY` while a
//!   filesystem is mounted on it or a device mapper, md or swap holds it. Plain openers are not
//!   seen, and an exclusive opener that arrives between this probe and the caller's STOP_DEV
//!   is not either; [`SafeStop::Probed`] says the caller still has to stop the device.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use libublk::sys;

use crate::features::{kernel_release, KernelFeatures};

/// What [`stop_if_unused`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SafeStop {
    /// TRY_STOP_DEV stopped the device (nothing had it open); the caller deletes it (its
    /// STOP_DEV then finds the device dead and returns at once).
    Stopped,
    /// No exclusive holder (kernel without SAFE_STOP_DEV): the device still serves, and the
    /// caller stops it.
    Probed,
}

/// Why [`stop_if_unused`] did not stop the device.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SafeStopError {
    /// Something has the block device open; the device was left serving.
    #[error("{path} is {how}: unmount it or close it first; the device keeps serving")]
    Busy { path: String, how: &'static str },
    /// The probe or the command failed for another reason.
    #[error("checking whether {path} is in use failed ({step}, kernel {kernel}): {source}")]
    Failed {
        path: String,
        step: &'static str,
        kernel: String,
        #[source]
        source: std::io::Error,
    },
}

/// Stops device `id` when nothing has `/dev/ublkb<id>` open, or says it is busy (see the
/// module docs). Blocking: TRY_STOP_DEV waits, like STOP_DEV, until the requests in flight
/// have completed, so the caller bounds it (and keeps serving the queues meanwhile).
pub fn stop_if_unused(id: u32) -> Result<SafeStop, SafeStopError> {
    let path = format!("/dev/ublkb{id}");
    let safe = KernelFeatures::probe()
        .map(|f| f.safe_stop())
        .unwrap_or(false);
    if safe {
        try_stop_dev(id, &path).map(|()| SafeStop::Stopped)
    } else {
        probe_exclusive(&path).map(|()| SafeStop::Probed)
    }
}

/// The fallback check alone: an `O_EXCL` open of block device `path`, closed at once.
/// [`SafeStopError::Busy`] while a filesystem is mounted on it or something else holds it
/// exclusively; plain openers are not seen.
pub fn probe_exclusive(path: &str) -> Result<(), SafeStopError> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(SafeStopError::Busy {
            path: path.to_string(),
            how: "mounted, or held exclusively (device mapper, md, swap)",
        }),
        Err(source) => Err(SafeStopError::Failed {
            path: path.to_string(),
            step: "open O_EXCL",
            kernel: kernel_release(),
            source,
        }),
    }
}

/// The command block of a control command (`struct ublksrv_ctrl_cmd`): device id, queue id
/// -1 (not a queue command), no buffer, no inline data.
fn ctrl_cmd_bytes(id: u32) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[0..4].copy_from_slice(&id.to_ne_bytes());
    cmd[4..6].copy_from_slice(&u16::MAX.to_ne_bytes());
    cmd
}

/// Sends `UBLK_U_CMD_TRY_STOP_DEV` for `id` on a one-entry ring and waits for its answer.
fn try_stop_dev(id: u32, path: &str) -> Result<(), SafeStopError> {
    let failed = |step: &'static str, source: std::io::Error| SafeStopError::Failed {
        path: path.to_string(),
        step,
        kernel: kernel_release(),
        source,
    };
    let control = File::options()
        .read(true)
        .write(true)
        .open(crate::features::CONTROL_PATH)
        .map_err(|e| failed("open /dev/ublk-control", e))?;
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder()
        .build(1)
        .map_err(|e| failed("io_uring setup", e))?;
    let sqe = opcode::UringCmd80::new(types::Fd(control.as_raw_fd()), sys::UBLK_U_CMD_TRY_STOP_DEV)
        .cmd(ctrl_cmd_bytes(id))
        .build();
    // SAFETY: the entry points at no memory (the command block is copied into the SQE, and
    // no buffer address is set), and `control` stays open until the completion was reaped
    // below, so the kernel never sees a closed descriptor.
    unsafe { ring.submission().push(&sqe) }.map_err(|_| {
        failed(
            "io_uring push",
            std::io::Error::other("submission queue full"),
        )
    })?;
    ring.submit_and_wait(1)
        .map_err(|e| failed("io_uring submit", e))?;
    let res = ring
        .completion()
        .next()
        .map(|c| c.result())
        .ok_or_else(|| failed("io_uring wait", std::io::Error::other("no completion")))?;
    drop(control);
    match res {
        r if r >= 0 => Ok(()),
        r if -r == libc::EBUSY => Err(SafeStopError::Busy {
            path: path.to_string(),
            how: "open (mounted, or held by a process)",
        }),
        r => Err(failed(
            "UBLK_U_CMD_TRY_STOP_DEV",
            std::io::Error::from_raw_os_error(-r),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_block_names_the_device_and_no_queue() {
        let cmd = ctrl_cmd_bytes(7);
        assert_eq!(u32::from_ne_bytes(cmd[0..4].try_into().unwrap()), 7);
        assert_eq!(u16::from_ne_bytes(cmd[4..6].try_into().unwrap()), u16::MAX);
        assert!(cmd[6..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_missing_block_device_is_a_failure_naming_it_not_busy() {
        let err = probe_exclusive("/dev/ublkb-glidefs-test-none").unwrap_err();
        assert!(matches!(err, SafeStopError::Failed { .. }), "{err:?}");
        assert!(err.to_string().contains("/dev/ublkb-glidefs-test-none"));
    }
}
