//! `glidefs features`: what the running kernel's ublk driver offers and which transport glidefs
//! would pick (honouring `GLIDEFS_FORCE_USER_COPY`).
//!
//! Contract: producing the report never fails and never panics. On a kernel without ublk (no
//! `/dev/ublk-control`, GET_FEATURES refused) the report says `ublk_available: false` with the
//! reason in `error`, and the command still exits 0: the report is the answer.

use serde::Serialize;
use ublk_core::transport::negotiate;
use ublk_core::KernelFeatures;

use crate::config::TransportChoice;

/// The report (`--json` prints it as is).
#[derive(Debug, Clone, Serialize)]
pub struct FeatureReport {
    /// `uname -r`.
    pub kernel: String,
    /// Whether the feature query succeeded.
    pub ublk_available: bool,
    /// Why not, when it did not.
    pub error: Option<String>,
    /// Raw feature mask (`0x...`).
    pub feature_bits: Option<String>,
    /// Names of the advertised bits.
    pub features: Vec<String>,
    pub zero_copy: bool,
    pub user_copy: bool,
    pub user_recovery: bool,
    /// `SAFE_STOP_DEV` (Linux 7.0+): a remove refuses a device anything has open, checked and
    /// stopped in one kernel step; without it only a mount or another exclusive holder is seen
    /// (an `O_EXCL` probe).
    pub safe_stop: bool,
    /// `BATCH_IO` (Linux 7.0+): a queue fetches and commits many requests per command
    /// (`ublk_core::BatchIo`; whether devices use it is their `batch_io` option).
    pub batch_io: bool,
    /// User-copy is forced (`ublk.transport = "user-copy"` or `GLIDEFS_FORCE_USER_COPY`).
    pub force_user_copy: bool,
    /// The transport a new device would get (`zero-copy`, `user-copy`), if any.
    pub transport: Option<String>,
    /// Why no transport can be used, when ublk answered but lacks what glidefs needs.
    pub transport_error: Option<String>,
}

impl FeatureReport {
    /// Probes the running kernel; `choice` is the transport new devices would ask for.
    pub fn probe(choice: TransportChoice) -> Self {
        let kernel = ublk_core::features::kernel_release();
        let force = choice == TransportChoice::UserCopy;
        match KernelFeatures::probe() {
            Ok(f) => {
                let t = negotiate(f, choice.preference(), &kernel);
                FeatureReport {
                    ublk_available: true,
                    error: None,
                    feature_bits: Some(format!("{:#x}", f.bits)),
                    features: f.names(),
                    zero_copy: f.zero_copy(),
                    user_copy: f.user_copy(),
                    user_recovery: f.user_recovery(),
                    safe_stop: f.safe_stop(),
                    batch_io: f.batch_io(),
                    force_user_copy: force,
                    transport: t.as_ref().ok().map(|t| t.name().to_string()),
                    transport_error: t.err().map(|e| e.to_string()),
                    kernel,
                }
            }
            Err(e) => FeatureReport {
                kernel,
                ublk_available: false,
                error: Some(e.to_string()),
                feature_bits: None,
                features: Vec::new(),
                zero_copy: false,
                user_copy: false,
                user_recovery: false,
                safe_stop: false,
                batch_io: false,
                force_user_copy: force,
                transport: None,
                transport_error: None,
            },
        }
    }

    /// Human-readable lines.
    pub fn text(&self) -> String {
        let mut s = format!("kernel: {}\n", self.kernel);
        if let Some(e) = &self.error {
            s.push_str(&format!("ublk: unavailable: {e}\n"));
            return s;
        }
        s.push_str(&format!(
            "ublk features: {} [{}]\n",
            self.feature_bits.as_deref().unwrap_or("?"),
            self.features.join(" ")
        ));
        s.push_str(&format!(
            "zero-copy (SUPPORT_ZERO_COPY|AUTO_BUF_REG): {}\n",
            self.zero_copy
        ));
        s.push_str(&format!("user-copy (USER_COPY): {}\n", self.user_copy));
        s.push_str(&format!(
            "user recovery (USER_RECOVERY): {}\n",
            self.user_recovery
        ));
        s.push_str(&format!(
            "remove refuses a device in use (SAFE_STOP_DEV): {}\n",
            if self.safe_stop {
                "any opener"
            } else {
                "mounts and exclusive holders only (O_EXCL probe)"
            }
        ));
        s.push_str(&format!(
            "batched fetch/commit (BATCH_IO): {}\n",
            self.batch_io
        ));
        s.push_str(&format!(
            "GLIDEFS_FORCE_USER_COPY: {}\n",
            self.force_user_copy
        ));
        match (&self.transport, &self.transport_error) {
            (Some(t), _) => s.push_str(&format!("transport: {t}\n")),
            (None, Some(e)) => s.push_str(&format!("transport: none: {e}\n")),
            (None, None) => s.push_str("transport: none\n"),
        }
        s
    }
}
