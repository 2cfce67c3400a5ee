//! Per-queue data plane: one io_uring and one loop per hardware queue, run on an OS thread
//! of its own ([`thread::spawn_queue`]) or on a thread of a [`pool::LoopPool`] shared by the
//! queues of many devices ([`pool::LoopPool::spawn_queue`]).
//!
//! Either way the serving thread builds the queue's io_uring, maps the queue's request
//! descriptors, queues a FETCH per tag (with `UBLK_F_BATCH_IO`: one PREP for all tags and one
//! multishot FETCH, see [`batch`]) and reports readiness before serving. The engine
//! ([`engine`]) is shared by both transports and both ways of running; only how a chunk
//! moves differs ([`zero_copy`] or [`user_copy`]), so a target is written once.
//!
//! Ownership: the loop borrows `/dev/ublkcN` (the fd belongs to the device and outlives
//! every queue loop); it owns its ring, its descriptor mapping and its eventfd (shared with
//! [`QueueHandle`]s, closed when the last handle drops).
//!
//! Stop: the owner raises the stop flag and writes the eventfd; the loop wakes, parks new
//! requests, finishes dispatched ones (see [`engine`]), submits its last COMMITs and drops
//! its ring. A device stop (STOP_DEV) or quiesce (QUIESCE_DEV) instead aborts every tag once
//! the kernel saw every request answered, and the loop leaves by itself once all tags are
//! gone.

pub mod batch;
pub(crate) mod cmd;
pub(crate) mod engine;
pub mod handle;
pub(crate) mod iod;
pub mod pool;
pub(crate) mod thread;
pub(crate) mod user_copy;
pub(crate) mod zero_copy;

pub use engine::LoopExit;
pub use handle::QueueHandle;
