//! Test kit for the glidefs storage engine.
//!
//! - [`s3_server`]: a real S3 protocol server (s3s + s3s-fs) inside the test process, so tests
//!   exercise conditional writes, ranged reads and listings over HTTP exactly like production;
//!   the `glidefs-s3-server` binary serves the same for scripts (`scripts/fio-soak`).
//!   [`s3_atomic`] makes its conditional writes atomic (s3s-fs alone checks, then writes).
//! - [`faulty_store`]: an `ObjectStore` wrapper that injects latency, transient and permanent
//!   errors, broken transfers, lost acknowledgements, bit flips, stalls, held calls, stale
//!   (empty) listings and outages, and counts every call ([`FaultPlan`] holds the faults;
//!   the S3 server can use one too, to lose HTTP replies and refuse requests during an
//!   outage).
//! - [`gated_store`]: an `ObjectStore` wrapper that holds GETs until the test opens its gate
//!   (a fetch kept in flight deterministically).
//! - [`mod@pattern`]: generation-tagged data patterns whose verifier says which offset and which
//!   generation it found when data does not match; [`noise`] for incompressible bytes.
//! - For the kernel tests: [`blockdev`] (O_DIRECT buffers, devices, blocks of the pattern
//!   written and verified), [`mod@fio`] (a fio run that fails on any error), [`process`] (a
//!   call bounded in time, open fds).
//!
//! Nothing here is used by production code.

pub mod blockdev;
pub mod fault;
pub mod faulty_store;
pub mod fio;
pub mod gated_store;
pub mod pattern;
pub mod process;
pub mod rng;
pub mod s3_atomic;
pub mod s3_get;
pub mod s3_server;

pub use fault::{is_injected, Fault, FaultPlan, FaultRule, InjectedFault, Op};
pub use faulty_store::{FaultyStore, OpCounts};
pub use gated_store::GatedStore;
pub use pattern::{
    block_pattern, fill_pattern, generation_of, noise, pattern, verify_block, verify_pattern,
    Found, Mismatch,
};
pub use s3_server::{S3Listener, S3Server, S3ServerError};
