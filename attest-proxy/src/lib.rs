//! aTLS-terminating proxy: verifies node attestation, forwards the join API to join-core over a Unix socket.
