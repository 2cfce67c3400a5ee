//! Transport negotiation: which data plane a new device gets.
//!
//! Rules, in order:
//! 1. A caller that prefers zero-copy gets it when the kernel has both
//!    `UBLK_F_SUPPORT_ZERO_COPY` and `UBLK_F_AUTO_BUF_REG` (Linux 6.16+, dependable from 6.17).
//! 2. Otherwise USER_COPY (`UBLK_F_USER_COPY`, Linux 6.5+).
//! 3. Otherwise an error naming the kernel release and the missing feature.
//!
//! The preference is the caller's only input: this crate reads no environment (an operator
//! override such as glidefs's `GLIDEFS_FORCE_USER_COPY` is the caller's to turn into
//! [`TransportPreference::UserCopy`]).

use crate::features::KernelFeatures;
use libublk::sys;

/// How request data moves between the kernel and the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// The kernel registers each request's pages in the queue's io_uring buffer table
    /// (`AUTO_BUF_REG`); chunks are `READ_FIXED`/`WRITE_FIXED` against the target's fds.
    ZeroCopy,
    /// Chunks are copied with pread/pwrite on `/dev/ublkcN` at the per-tag offset.
    UserCopy,
}

impl Transport {
    /// The `UBLK_F_*` bits a device of this transport is created with.
    pub fn dev_flags(self) -> u64 {
        match self {
            Transport::ZeroCopy => {
                sys::UBLK_F_SUPPORT_ZERO_COPY as u64 | sys::UBLK_F_AUTO_BUF_REG as u64
            }
            Transport::UserCopy => sys::UBLK_F_USER_COPY as u64,
        }
    }

    /// The transport a device runs, read from its `dev_info.flags`.
    pub fn from_dev_flags(flags: u64) -> Option<Transport> {
        if flags & Transport::ZeroCopy.dev_flags() == Transport::ZeroCopy.dev_flags() {
            Some(Transport::ZeroCopy)
        } else if flags & sys::UBLK_F_USER_COPY as u64 != 0 {
            Some(Transport::UserCopy)
        } else {
            None
        }
    }

    /// Short name for logs and reports (`zero-copy`, `user-copy`).
    pub fn name(self) -> &'static str {
        match self {
            Transport::ZeroCopy => "zero-copy",
            Transport::UserCopy => "user-copy",
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the caller would like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportPreference {
    /// Zero-copy when the kernel has it, else USER_COPY.
    #[default]
    PreferZeroCopy,
    /// USER_COPY even where zero-copy is available.
    UserCopy,
}

/// The kernel cannot serve any transport we implement.
#[derive(Debug, thiserror::Error)]
#[error("kernel {kernel} lacks ublk {missing} (features {features:#x}); glidefs needs USER_COPY (Linux 6.5+) or SUPPORT_ZERO_COPY+AUTO_BUF_REG (Linux 6.16+)")]
pub struct TransportError {
    /// `uname -r` of the running kernel.
    pub kernel: String,
    /// Name of the missing feature.
    pub missing: &'static str,
    /// The kernel's feature mask.
    pub features: u64,
}

/// Pick a transport from the kernel's features and the caller's preference (pure).
pub fn negotiate(
    features: KernelFeatures,
    preference: TransportPreference,
    kernel: &str,
) -> Result<Transport, TransportError> {
    let want_zc = preference == TransportPreference::PreferZeroCopy;
    if want_zc && features.zero_copy() {
        return Ok(Transport::ZeroCopy);
    }
    if features.user_copy() {
        return Ok(Transport::UserCopy);
    }
    Err(TransportError {
        kernel: kernel.to_string(),
        missing: "USER_COPY",
        features: features.bits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZC: u64 = sys::UBLK_F_SUPPORT_ZERO_COPY as u64 | sys::UBLK_F_AUTO_BUF_REG as u64;
    const UC: u64 = sys::UBLK_F_USER_COPY as u64;

    fn feats(bits: u64) -> KernelFeatures {
        KernelFeatures { bits }
    }

    #[test]
    fn zero_copy_when_preferred_and_available() {
        let t = negotiate(feats(ZC | UC), TransportPreference::PreferZeroCopy, "7.3");
        assert_eq!(t.unwrap(), Transport::ZeroCopy);
    }

    #[test]
    fn the_preference_forces_user_copy() {
        let asked = negotiate(feats(ZC | UC), TransportPreference::UserCopy, "7.3");
        assert_eq!(asked.unwrap(), Transport::UserCopy);
    }

    #[test]
    fn half_zero_copy_falls_back_to_user_copy() {
        let bits = sys::UBLK_F_SUPPORT_ZERO_COPY as u64 | UC;
        let t = negotiate(feats(bits), TransportPreference::PreferZeroCopy, "6.12");
        assert_eq!(t.unwrap(), Transport::UserCopy);
    }

    #[test]
    fn no_user_copy_is_a_clear_error() {
        let err = negotiate(
            feats(0x1),
            TransportPreference::PreferZeroCopy,
            "6.1.0-test",
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("6.1.0-test") && msg.contains("USER_COPY"),
            "{msg}"
        );
    }

    #[test]
    fn transport_round_trips_through_dev_flags() {
        for t in [Transport::ZeroCopy, Transport::UserCopy] {
            assert_eq!(Transport::from_dev_flags(t.dev_flags() | 0x40), Some(t));
        }
        assert_eq!(Transport::from_dev_flags(0), None);
    }
}
