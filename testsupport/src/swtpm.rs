//! A real TPM 2.0 emulator (swtpm) per test, on free ports.
