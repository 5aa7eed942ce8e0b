//! Key service speaking Constellation's kms.API with Constellation-managed HKDF derivation (local runs and tests).
