//! glidefs' ublk transport.
//!
//! Device lifecycle on top of the `libublk` control plane ([`Device`], [`ctrl`]) and the
//! per-queue io_uring data plane ([`queue`]): kernel zero-copy with `AUTO_BUF_REG`, or
//! USER_COPY, chosen by [`transport`]. This crate knows nothing about caches or object
//! stores: a [`Target`] answers requests, the transport moves the bytes.
//!
//! Threads and ownership at a glance:
//! - The caller's thread runs control commands (create, stop, delete, recover).
//! - Each hardware queue has a loop with its own io_uring; it borrows `/dev/ublkcN`, which
//!   the [`Device`] owns and closes only after every queue loop ended. A loop runs on an OS
//!   thread of its own, or on a thread of a [`LoopPool`] that serves the queues of many
//!   devices (threads then do not grow with the device count).
//! - Targets run `dispatch` and the after-I/O hooks on the queue thread and must not block
//!   there; blocking work is deferred and finished from any thread through a [`Deferred`].
//! - A [`Chunk`] that names a file owns it (an `Arc<File>` clone), so the fd the kernel is
//!   given is open until the chunk completed; a [`Chunk::Zeros`] has no fd.
//! - A request's keepalive ([`Target::Keepalive`], the target's own type) lives until the
//!   kernel moves no more data for it; a WRITE's is then handed to [`Target::after_write`],
//!   which may commit it off the loop thread.

pub mod ctrl;
pub mod device;
pub mod error;
pub mod features;
pub mod file_probe;
pub mod io;
pub mod queue;
pub mod safe_stop;
pub mod target;
pub mod targets;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;

pub use ctrl::{
    delete_device, device_info, list_device_ids, list_devices, update_size, DeviceInfo,
    DeviceState, ResizeError,
};
pub use device::{Device, DeviceConfig, QueueOptions};
pub use error::{Error, Result};
pub use features::{FeatureError, KernelFeatures};
pub use file_probe::inline_buffered_writes;
pub use queue::batch::BatchIo;
pub use queue::handle::{Deferred, DispatchCtx, QueueHandle};
pub use queue::pool::LoopPool;
pub use queue::LoopExit;
pub use safe_stop::{stop_if_unused, SafeStop, SafeStopError};
pub use target::{Action, Chunk, Dispatch, IoDesc, IoOp, Target};
pub use transport::{Transport, TransportPreference};
