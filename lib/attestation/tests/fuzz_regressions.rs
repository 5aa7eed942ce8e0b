//! Replays every input the fuzzers ever crashed on (`testdata/fuzz-regressions/<target>/`) and
//! every fuzz seed (`fuzz/seeds/<target>/`) through the very functions the fuzz targets run, so
//! what the fuzzers found stays fixed without a nightly toolchain or cargo-fuzz.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

#[path = "../../../fuzz/src/targets.rs"]
mod targets;

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

fn replay(root: &Path) -> usize {
    let mut count = 0;
    for (name, target) in targets::TARGETS {
        for file in inputs(&root.join(name)) {
            let data = std::fs::read(&file).unwrap();
            // A panic names the input that caused it.
            eprintln!("{name}: {}", file.display());
            target(&data);
            count += 1;
        }
    }
    count
}

#[test]
fn saved_crash_inputs_stay_fixed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/fuzz-regressions");
    assert!(root.is_dir(), "{} is missing", root.display());
    replay(&root);
}

#[test]
fn fuzz_seeds_run_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    assert!(replay(&root) >= 20, "the seed corpus is missing");
}
