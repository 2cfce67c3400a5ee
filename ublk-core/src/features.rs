//! Kernel ublk feature discovery.
//!
//! The kernel advertises what its ublk driver supports as a bit mask answered to
//! `UBLK_U_CMD_GET_FEATURES` on `/dev/ublk-control` (Linux 6.5+). [`KernelFeatures::probe`]
//! reads it once; the transport choice is made from it.

use libublk::sys;

/// Errors while probing the kernel's ublk support.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FeatureError {
    /// `/dev/ublk-control` is absent: the driver is not loaded or not built.
    #[error("{path} not found: the kernel ({kernel}) has no ublk driver loaded (try `modprobe ublk_drv`)")]
    NoControlDevice { path: &'static str, kernel: String },
    /// The control device exists but GET_FEATURES failed (kernel older than 6.5, or no
    /// permission).
    #[error("UBLK_U_CMD_GET_FEATURES failed on {path} (kernel {kernel}; needs Linux 6.5+ and CAP_SYS_ADMIN)")]
    QueryFailed { path: &'static str, kernel: String },
}

/// Path of the ublk control device.
pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// One named feature bit, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureBit {
    /// The kernel's name without the `UBLK_F_` prefix.
    pub name: &'static str,
    /// The bit's value.
    pub mask: u64,
}

/// Every feature bit this crate knows by name, in bit order.
pub const KNOWN_FEATURES: &[FeatureBit] = &[
    FeatureBit {
        name: "SUPPORT_ZERO_COPY",
        mask: sys::UBLK_F_SUPPORT_ZERO_COPY as u64,
    },
    FeatureBit {
        name: "URING_CMD_COMP_IN_TASK",
        mask: sys::UBLK_F_URING_CMD_COMP_IN_TASK as u64,
    },
    FeatureBit {
        name: "NEED_GET_DATA",
        mask: sys::UBLK_F_NEED_GET_DATA as u64,
    },
    FeatureBit {
        name: "USER_RECOVERY",
        mask: sys::UBLK_F_USER_RECOVERY as u64,
    },
    FeatureBit {
        name: "USER_RECOVERY_REISSUE",
        mask: sys::UBLK_F_USER_RECOVERY_REISSUE as u64,
    },
    FeatureBit {
        name: "UNPRIVILEGED_DEV",
        mask: sys::UBLK_F_UNPRIVILEGED_DEV as u64,
    },
    FeatureBit {
        name: "CMD_IOCTL_ENCODE",
        mask: sys::UBLK_F_CMD_IOCTL_ENCODE as u64,
    },
    FeatureBit {
        name: "USER_COPY",
        mask: sys::UBLK_F_USER_COPY as u64,
    },
    FeatureBit {
        name: "ZONED",
        mask: sys::UBLK_F_ZONED as u64,
    },
    FeatureBit {
        name: "USER_RECOVERY_FAIL_IO",
        mask: sys::UBLK_F_USER_RECOVERY_FAIL_IO as u64,
    },
    FeatureBit {
        name: "UPDATE_SIZE",
        mask: sys::UBLK_F_UPDATE_SIZE as u64,
    },
    FeatureBit {
        name: "AUTO_BUF_REG",
        mask: sys::UBLK_F_AUTO_BUF_REG as u64,
    },
    FeatureBit {
        name: "QUIESCE",
        mask: sys::UBLK_F_QUIESCE as u64,
    },
    FeatureBit {
        name: "PER_IO_DAEMON",
        mask: sys::UBLK_F_PER_IO_DAEMON as u64,
    },
    FeatureBit {
        name: "BUF_REG_OFF_DAEMON",
        mask: sys::UBLK_F_BUF_REG_OFF_DAEMON as u64,
    },
    FeatureBit {
        name: "BATCH_IO",
        mask: sys::UBLK_F_BATCH_IO as u64,
    },
    FeatureBit {
        name: "INTEGRITY",
        mask: sys::UBLK_F_INTEGRITY as u64,
    },
    FeatureBit {
        name: "SAFE_STOP_DEV",
        mask: sys::UBLK_F_SAFE_STOP_DEV as u64,
    },
    FeatureBit {
        name: "NO_AUTO_PART_SCAN",
        mask: sys::UBLK_F_NO_AUTO_PART_SCAN as u64,
    },
    FeatureBit {
        name: "SHMEM_ZC",
        mask: sys::UBLK_F_SHMEM_ZC as u64,
    },
];

/// The kernel's ublk feature bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFeatures {
    /// Raw mask as answered by the kernel.
    pub bits: u64,
}

impl KernelFeatures {
    /// Ask the running kernel (needs `/dev/ublk-control` and CAP_SYS_ADMIN).
    pub fn probe() -> Result<Self, FeatureError> {
        if !std::path::Path::new(CONTROL_PATH).exists() {
            return Err(FeatureError::NoControlDevice {
                path: CONTROL_PATH,
                kernel: kernel_release(),
            });
        }
        libublk::ctrl::UblkCtrl::get_features()
            .map(|bits| Self { bits })
            .ok_or_else(|| FeatureError::QueryFailed {
                path: CONTROL_PATH,
                kernel: kernel_release(),
            })
    }

    /// Whether every bit of `mask` is advertised.
    pub fn has(&self, mask: u64) -> bool {
        self.bits & mask == mask
    }

    /// Kernel zero-copy with automatic buffer registration (`SUPPORT_ZERO_COPY | AUTO_BUF_REG`).
    pub fn zero_copy(&self) -> bool {
        self.has(sys::UBLK_F_SUPPORT_ZERO_COPY as u64 | sys::UBLK_F_AUTO_BUF_REG as u64)
    }

    /// `UBLK_F_USER_COPY` (Linux 6.5+).
    pub fn user_copy(&self) -> bool {
        self.has(sys::UBLK_F_USER_COPY as u64)
    }

    /// `UBLK_F_USER_RECOVERY`: a successor process can reattach a quiesced device.
    pub fn user_recovery(&self) -> bool {
        self.has(sys::UBLK_F_USER_RECOVERY as u64)
    }

    /// `UBLK_F_UPDATE_SIZE` (Linux 6.16+): the driver knows UPDATE_SIZE, which changes a
    /// live device's capacity ([`crate::ctrl::update_size`]).
    pub fn update_size(&self) -> bool {
        self.has(sys::UBLK_F_UPDATE_SIZE as u64)
    }

    /// `UBLK_F_SAFE_STOP_DEV` (Linux 7.0+): the driver answers `UBLK_U_CMD_TRY_STOP_DEV`,
    /// which stops a device only when nothing has it open ([`crate::safe_stop`]).
    pub fn safe_stop(&self) -> bool {
        self.has(sys::UBLK_F_SAFE_STOP_DEV as u64)
    }

    /// `UBLK_F_BATCH_IO` (Linux 7.0+): the queue fetches and commits many requests per
    /// command ([`crate::queue::batch`]).
    pub fn batch_io(&self) -> bool {
        self.has(sys::UBLK_F_BATCH_IO as u64)
    }

    /// Names of the advertised bits this crate knows, plus `0x..` for unknown ones.
    pub fn names(&self) -> Vec<String> {
        let mut out: Vec<String> = KNOWN_FEATURES
            .iter()
            .filter(|f| self.has(f.mask))
            .map(|f| f.name.to_string())
            .collect();
        let known = KNOWN_FEATURES.iter().fold(0u64, |acc, f| acc | f.mask);
        if self.bits & !known != 0 {
            out.push(format!("unknown:{:#x}", self.bits & !known));
        }
        out
    }
}

impl std::fmt::Display for KernelFeatures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x} [{}]", self.bits, self.names().join(" "))
    }
}

/// The running kernel's release string (`uname -r`), or `unknown`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lists_known_and_unknown_bits() {
        let zc = sys::UBLK_F_SUPPORT_ZERO_COPY as u64 | sys::UBLK_F_AUTO_BUF_REG as u64;
        let f = KernelFeatures {
            bits: zc | (1 << 62),
        };
        assert!(f.zero_copy());
        assert!(!f.user_copy());
        assert_eq!(
            f.names(),
            vec![
                "SUPPORT_ZERO_COPY",
                "AUTO_BUF_REG",
                "unknown:0x4000000000000000"
            ]
        );
    }

    #[test]
    fn zero_copy_needs_both_bits() {
        let f = KernelFeatures {
            bits: sys::UBLK_F_SUPPORT_ZERO_COPY as u64,
        };
        assert!(!f.zero_copy());
    }
}
