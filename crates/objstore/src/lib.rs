//! Object-store layout (see Cargo.toml description).
