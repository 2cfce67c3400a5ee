//! Test kit (see Cargo.toml description).
