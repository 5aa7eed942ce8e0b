//! Test and local-run support: a real swtpm per test, a harness that starts the whole system
//! as real processes over real Unix sockets, and simulated SEV-SNP machines with AMD's KDS
//! stand-in for the SNP variants.

pub mod harness;
pub mod process;
pub mod snp;
pub mod swtpm;
