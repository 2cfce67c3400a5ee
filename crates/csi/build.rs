//! Compiles proto/csi.proto into prost messages and tonic clients and servers, with protox
//! (a protobuf compiler in Rust: no system `protoc`).
//!
//! Writes to OUT_DIR:
//! - `csi.v1.rs`: the generated code, included by `src/pb.rs`;
//! - `csi_descriptor.bin`: the encoded `FileDescriptorSet` (csi.proto and the well-known
//!   types it imports), for gRPC reflection.

use std::env;
use std::error::Error;
use std::fs;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    println!("cargo:rerun-if-changed=build.rs");

    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").ok_or("no CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or("no OUT_DIR")?);

    let mut compiler = protox::Compiler::new([manifest_dir.join("proto")])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_file("csi.proto")?;
    fs::write(
        out_dir.join("csi_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    // The well-known types that csi.proto imports are not generated again: they map to
    // prost-types (Timestamp) and to Option<bool> / Option<i64> (BoolValue, Int64Value).
    let fds = compiler.file_descriptor_set();

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // An RPC a server does not implement answers UNIMPLEMENTED, as the spec asks of an
        // unsupported RPC.
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
