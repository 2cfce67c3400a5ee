//! The CSI v1 gRPC API (package `csi.v1`), generated at build time from `proto/csi.proto`:
//! prost messages, the `identity_server`, `controller_server` and `node_server` modules
//! (traits `Identity`, `Controller`, `Node` and their tonic services) and the matching
//! `*_client` modules.
//!
//! Each server trait has a default body for every RPC that answers `UNIMPLEMENTED`, so an
//! implementation overrides only the RPCs it supports.

// Generated code: neither its style nor its docs are ours to lint.
#![allow(
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

tonic::include_proto!("csi.v1");

/// The encoded `FileDescriptorSet` of `csi.proto` and the well-known types it imports
/// (for a gRPC reflection service).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/csi_descriptor.bin"));
