//! glidefs' ublk transport.
//!
//! Device lifecycle on top of the `libublk` control plane and the per-queue io_uring data
//! plane (kernel zero-copy with AUTO_BUF_REG, or USER_COPY). This crate knows nothing about
//! caches or object stores: a target answers requests, the transport moves the bytes.

pub mod features;

pub use features::{FeatureError, KernelFeatures};
