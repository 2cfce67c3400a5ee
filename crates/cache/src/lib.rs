//! Local write cache (see Cargo.toml description).
