//! Test and local-run support: a real swtpm per test, a harness that starts the whole system
//! as real processes over real Unix sockets, simulated SEV-SNP machines with AMD's KDS
//! stand-in for the SNP variants, and simulated TDX machines with Intel's PCS stand-in for the
//! TDX variants, Azure's paravisor played on a swtpm for the Azure variants, simulated Azure
//! Trusted Launch VMs with their AK certificates for azure-trustedlaunch, Google's part of a
//! GCE confidential VM (AK template, firmware record) for gcp-sev-es, and the EC2 stand-in for
//! aws-nitro-tpm.

pub mod azure;
pub mod cluster;
pub mod control_plane;
pub mod fixtures;
pub mod gce;
pub mod harness;
pub mod kube_faults;
pub mod nitro;
pub mod process;
pub mod shared;
pub mod snp;
pub mod swtpm;
pub mod tdx;
pub mod trustedlaunch;
