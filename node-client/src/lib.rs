//! Node-side join client: aTLS with TPM attestation, writes the join ticket to disk.
