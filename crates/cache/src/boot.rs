//! Which boot of the machine wrote a cache directory: tells a process crash (the page cache
//! survived, so every byte written before the crash reads back) from a power loss or kernel
//! crash (a different boot: writes that were not synced may be gone, and the disk may have
//! persisted them in any order — a WAL page before the data pages its records point at).
//!
//! `Cache::open` stores the kernel's boot id in `boot_id` (replaced atomically and durably,
//! before the first WAL record of the session) and compares it at the next open. A missing
//! file (a directory written by an older version) counts as the same boot: recovery then
//! trusts the log as before.

use std::path::Path;

use crate::durable::write_atomic;
use crate::error::{CacheError, Result};

pub(crate) const FILE: &str = "boot_id";
const SOURCE: &str = "/proc/sys/kernel/random/boot_id";

/// The running kernel's boot id; empty when it cannot be read (then every open looks like the
/// same boot, the behaviour before boot ids were kept).
pub(crate) fn current() -> String {
    match std::fs::read_to_string(SOURCE) {
        Ok(s) => s.trim().to_string(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read {SOURCE}; power loss cannot be told from a process crash");
            String::new()
        }
    }
}

/// Whether the directory was last opened in the boot `now` (true when it holds no boot id).
pub(crate) fn same_boot(dir: &Path, now: &str) -> Result<bool> {
    let path = dir.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) => Ok(s.trim() == now),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(CacheError::io("read", &path, e)),
    }
}

/// Stores `now` as the directory's boot, durably (`write_atomic`: its directory fsync also
/// makes durable whatever the caller removed from `dir` before).
pub(crate) fn store(dir: &Path, now: &str) -> Result<()> {
    Ok(write_atomic(
        &dir.join(FILE),
        format!("{now}\n").as_bytes(),
    )?)
}
