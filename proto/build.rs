//! Compiles the .proto files with protox (pure Rust), so building needs no system protoc.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from("proto");
    let files = [
        "certifier/certifier.proto",
        "components/components.proto",
        "ec2identity/ec2identity.proto",
        "gceidentity/gceidentity.proto",
        "join/join.proto",
        "kms/kms.proto",
        "tokenissuer/tokenissuer.proto",
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let descriptors = protox::compile(files, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
