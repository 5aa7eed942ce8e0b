//! One module per attestation variant, each behind the [`Validator`](crate::Validator) trait.
//!
//! A variant decides what makes the evidence's key trustworthy (for qemu-vtpm, configuration;
//! for the hardware variants, AMD's or Intel's signature chain; for azure-trustedlaunch, Azure's
//! certificate for the vTPM's key) and then applies the measurement policy. What variants share lives beside this module, not in it: TPM structures
//! ([`crate::tpm`]), the vTPM document and its quote checks ([`crate::vtpm`]), TCG event logs
//! ([`crate::eventlog`]), the measurement policy ([`crate::policy`]) and the audit record
//! ([`crate::audit`]).
//!
//! A new variant goes here as `variants/<name>.rs` (or `variants/<name>/` when it brings its own
//! parsers), gets a [`Variant`](crate::Variant) value and OID in [`crate::variant`], and is
//! re-exported from the crate root.

pub mod aws_nitro_tpm;
pub mod azure_trustedlaunch;
pub mod gcp_sev_es;
pub mod qemu_vtpm;
pub mod sev_snp;
pub mod tdx;
