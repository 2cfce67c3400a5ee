//! Ready-made targets for tests, benchmarks and examples.

pub mod mem;
pub mod null;

pub use mem::{DeferPolicy, MemOptions, MemTarget};
pub use null::NullTarget;
