//! Volume engine (see Cargo.toml description).
