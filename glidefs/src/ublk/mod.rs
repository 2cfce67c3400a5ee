//! The volumes' block devices: a ublk target per volume and the exporter that creates,
//! recovers and stops them for the manager.

pub mod exporter;
pub mod features;
pub mod io_stats;
pub mod volume_target;
