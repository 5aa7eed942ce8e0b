//! Node-side vTPM attestation: quotes from a real TPM (device or swtpm) through the TSS.
