//! The harness of the API tests (`api_*` targets), in-process and without a kernel:
//! [`daemon`] starts a daemon on a temporary directory and holds the assertions every test
//! uses, [`http`] speaks raw HTTP to it, [`exporters`] are fake device layers. Faults in the
//! object store come from `glidefs_testkit::FaultyStore`.
//!
//! Every endpoint and every error code of `glidefs/API.md` is checked across the targets,
//! mostly by tables: each case asserts the HTTP status, that the body is the JSON error
//! document with the stable code and a message, and that the daemon still answers afterwards.

#![allow(dead_code)] // each test target uses a different part

pub mod daemon;
pub mod exporters;
pub mod http;
