//! Azure's paravisor (the HCL), simulated: the report it leaves in the vTPM's NV index
//! 0x01400001 for a hardware report it got at boot and the runtime data naming its vTPM
//! attestation key.
//!
//! Layout (little-endian): a 32-byte header (`HCLA`, version 2, total size, request type 2,
//! status 0, reserved), the hardware report padded to 1184 bytes, then the IGVM request data:
//! its size, version 1, the report type (2 SEV-SNP, 4 TDX), the report-data hash type (1,
//! SHA-256), the runtime data's size and the runtime data. The hardware report's
//! REPORT_DATA[0:32] is SHA-256 of the runtime data; making it so is the caller's part, as the
//! report comes from the simulated AMD or Intel.

/// The report type of an SEV-SNP report.
pub const REPORT_TYPE_SNP: u32 = 2;
/// The report type of a TDX TD report.
pub const REPORT_TYPE_TDX: u32 = 4;

const HW_REPORT_AREA: usize = 1184;

/// An HCL report holding `hw_report` (at most 1184 bytes) of `report_type` and `runtime_data`.
pub fn hcl_report(report_type: u32, hw_report: &[u8], runtime_data: &[u8]) -> Vec<u8> {
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    let request_len = 20 + runtime_data.len();
    let total = 32 + HW_REPORT_AREA + request_len;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(b"HCLA");
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&len(total));
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&[0; 12]);
    let mut area = [0u8; HW_REPORT_AREA];
    let n = hw_report.len().min(HW_REPORT_AREA);
    area[..n].copy_from_slice(&hw_report[..n]);
    out.extend_from_slice(&area);
    out.extend_from_slice(&len(request_len));
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&report_type.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&len(runtime_data.len()));
    out.extend_from_slice(runtime_data);
    out
}

/// The 64 bytes of REPORT_DATA that bind `runtime_data`: its SHA-256, zero-padded.
pub fn report_data_for(runtime_data: &[u8]) -> [u8; 64] {
    let mut data = [0u8; 64];
    data[..32].copy_from_slice(
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, runtime_data).as_ref(),
    );
    data
}
