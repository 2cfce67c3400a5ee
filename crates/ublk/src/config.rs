//! `[ublk]` of the daemon's configuration: how devices talk to the kernel. The daemon's
//! config file holds it; the exporter and the feature report read it.

use serde::{Deserialize, Serialize};
use ublk_core::{BatchIo, TransportPreference};

/// `[ublk]`: how devices talk to the kernel.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct UblkSection {
    /// `auto` (zero-copy where the kernel has it, else user-copy) or `user-copy`;
    /// `$GLIDEFS_FORCE_USER_COPY` (anything but `0`) forces `user-copy`. Default `auto`.
    pub transport: TransportChoice,
    /// Threads serving the queues of every device, shared (each queue keeps its own
    /// io_uring; a thread waits on many). Absent: one per CPU, at most 32. `0`: a thread of
    /// its own per queue (threads then grow with the device count). At most 256.
    pub queue_threads: Option<u32>,
    /// Queues that get a thread of their own before the shared pool serves the rest: a
    /// device whose queues all fit in what is left of this is served by threads of its own
    /// (a request's wake-up goes straight to its ring's waiter, no `epoll_wait` hop: hot 4k
    /// reads at QD1 with 4 jobs 0.85-0.94x the null target, 0.72x on the pool; see
    /// docs/runs/bench/2026-11-28-own-threads),
    /// any other device by the pool; a removed device gives its queues back. Threads stay
    /// bounded (this plus the pool's) whatever the device count. Absent: one per CPU, at most
    /// 32. `0`: every device on the pool. At most 256. Ignored with `queue_threads = 0`.
    pub own_thread_queues: Option<u32>,
    /// `UBLK_F_BATCH_IO` (Linux 7.0+: one multishot FETCH and one COMMIT per loop turn instead
    /// of a command per request) for new devices: `auto` (where the kernel has it), `on`
    /// (creating a device fails without it) or `off`; `$GLIDEFS_BATCH_IO` overrides. Default
    /// `off` until it shows a gain (docs/runs/bench/2026-11-27-batch). A recovered device keeps
    /// the mode it was created with.
    pub batch_io: BatchIoChoice,
    /// Test hook from `$UBLK_CORE_FAULT_RING_AFTER`: queue rings fail after this many
    /// requests. Never from the file.
    #[serde(skip)]
    pub fault_ring_after: Option<u64>,
}

impl UblkSection {
    /// Threads of the shared queue loop pool: `None` for a thread per queue (`queue_threads
    /// = 0`), else the configured count or one per CPU (1..=32).
    pub fn pool_threads(&self) -> Option<usize> {
        match self.queue_threads {
            Some(0) => None,
            Some(n) => Some(usize::try_from(n).unwrap_or(1)),
            None => Some(cpus_up_to_32()),
        }
    }

    /// Queues served by threads of their own before the pool takes new devices (see
    /// `own_thread_queues`); unbounded (`usize::MAX`) without a pool.
    pub fn own_thread_queues(&self) -> usize {
        if self.pool_threads().is_none() {
            return usize::MAX;
        }
        self.own_thread_queues
            .map_or_else(cpus_up_to_32, |n| usize::try_from(n).unwrap_or(0))
    }
}

/// One per CPU, at least 1 and at most 32.
fn cpus_up_to_32() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 32)
}

/// Which transport new devices ask for.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TransportChoice {
    /// Zero-copy when the kernel has it, else user-copy.
    #[default]
    Auto,
    /// User-copy even where zero-copy is available.
    UserCopy,
}

impl TransportChoice {
    /// The preference a device is created with.
    pub fn preference(self) -> TransportPreference {
        match self {
            TransportChoice::Auto => TransportPreference::PreferZeroCopy,
            TransportChoice::UserCopy => TransportPreference::UserCopy,
        }
    }
}

/// `ublk.batch_io`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum BatchIoChoice {
    /// Where the kernel advertises it.
    Auto,
    /// Always (creating a device fails on a kernel without it).
    On,
    /// Never.
    #[default]
    Off,
}

impl BatchIoChoice {
    /// The queue option a device is created with.
    pub fn option(self) -> BatchIo {
        match self {
            BatchIoChoice::Auto => BatchIo::Auto,
            BatchIoChoice::On => BatchIo::On,
            BatchIoChoice::Off => BatchIo::Off,
        }
    }
}

impl std::str::FromStr for BatchIoChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(BatchIoChoice::Auto),
            "on" => Ok(BatchIoChoice::On),
            "off" => Ok(BatchIoChoice::Off),
            other => Err(format!("{other:?} is not one of auto, on, off")),
        }
    }
}
