//! Helpers for tests (feature `testing`; nothing here is used by the transport itself).
//!
//! - [`harness`]: a queue loop without a kernel ([`Harness`]), for a target's own tests.
//! - [`devices`]: for the kernel tests: a mem device on the transport a test row asks for
//!   (failing unless the kernel granted exactly it), and the ublk block devices the kernel
//!   shows.

pub mod devices;
pub mod harness;

pub use harness::{request, run_chunks, Harness, HarnessError, DEFERRED_WAIT};
