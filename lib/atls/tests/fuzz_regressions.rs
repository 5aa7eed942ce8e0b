//! Replays every fuzz seed of the aTLS targets (`fuzz/seeds/<target>/`) and every input they ever
//! crashed on (kept with the other targets' in `lib/attestation/testdata/fuzz-regressions/<target>/`)
//! through the very functions the fuzz targets run (`fuzz/src/atls_targets.rs`), without a
//! nightly toolchain or cargo-fuzz.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

#[path = "../../../fuzz/src/atls_targets.rs"]
mod atls_targets;

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every input under `root/<target>/`; returns how many there were per target.
fn replay(root: &Path) -> Vec<(&'static str, usize)> {
    atls_targets::TARGETS
        .iter()
        .map(|(name, target)| {
            let files = inputs(&root.join(name));
            for file in &files {
                // A panic names the input that caused it.
                eprintln!("{name}: {}", file.display());
                target(&std::fs::read(file).unwrap());
            }
            (*name, files.len())
        })
        .collect()
}

#[test]
fn fuzz_seeds_and_saved_crash_inputs_run_cleanly() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, count) in replay(&here.join("../../fuzz/seeds")) {
        assert!(count > 0, "no seeds for {name}");
    }
    replay(&here.join("../attestation/testdata/fuzz-regressions"));
}
