//! Errors of the ublk transport.
//!
//! Control-plane failures carry the device id and the step that failed; data-plane failures
//! never surface here (a request that fails completes with a negative errno instead).

use std::io;

/// What went wrong while managing a ublk device or starting its queues.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Probing the kernel's features failed (no driver, kernel too old).
    #[error(transparent)]
    Features(#[from] crate::features::FeatureError),
    /// The kernel cannot serve the transport we need.
    #[error(transparent)]
    Transport(#[from] crate::transport::TransportError),
    /// `batch_io = On` where the kernel has no `UBLK_F_BATCH_IO`, or ADD_DEV did not grant it.
    #[error(transparent)]
    BatchIo(#[from] crate::queue::batch::BatchIoError),
    /// A control command (`/dev/ublk-control`) failed.
    #[error("ublk control `{step}` failed: device={dev} kernel={kernel}: {source}")]
    Control {
        step: &'static str,
        dev: String,
        kernel: String,
        #[source]
        source: libublk::UblkError,
    },
    /// Setting up a queue thread (ring, mmap, FETCH) failed.
    #[error("ublk queue setup failed: device={dev} queue={queue}: {source}")]
    QueueSetup {
        dev: u32,
        queue: u16,
        #[source]
        source: io::Error,
    },
    /// Starting a thread of a queue loop pool failed.
    #[error("starting queue loop pool thread {thread} failed: {source}")]
    PoolSetup {
        thread: usize,
        #[source]
        source: io::Error,
    },
    /// Queue threads did not exit within the stop deadline (they were detached).
    #[error("ublk queues did not stop in time: device={dev} queues={queues:?}")]
    StopTimeout { dev: u32, queues: Vec<u16> },
    /// A control command did not finish in time (it goes on on a detached helper thread).
    #[error("ublk control `{step}` did not finish within {timeout:?}: device={dev}")]
    ControlTimeout {
        step: &'static str,
        dev: u32,
        timeout: std::time::Duration,
    },
    /// A configuration value is out of range.
    #[error("invalid ublk device config: {0}")]
    InvalidConfig(String),
    /// The device is not in a state that allows the operation.
    #[error("ublk device {dev} is {state}, cannot {what}")]
    WrongState {
        dev: u32,
        state: String,
        what: &'static str,
    },
}

impl Error {
    pub(crate) fn control(
        step: &'static str,
        dev: impl ToString,
        source: libublk::UblkError,
    ) -> Self {
        Error::Control {
            step,
            dev: dev.to_string(),
            kernel: crate::features::kernel_release(),
            source,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
