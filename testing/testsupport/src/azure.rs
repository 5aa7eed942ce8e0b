//! Azure's paravisor (the HCL), played on a swtpm: what it does to an Azure CVM's vTPM at boot.
//! It persists an RSA attestation key at 0x81000003 and leaves in NV index 0x01400001 an HCL
//! report whose hardware report (from soft-issuer's simulated AMD or Intel) binds runtime data
//! naming that key. `tpm-issuer`'s Azure issuers then read them as on Azure.

use anyhow::Context as _;
use soft_issuer::snp::{ReportFields, SimulatedSigner, azure_runtime_data_for_public};
use tss_esapi::Context;
use tss_esapi::attributes::NvIndexAttributesBuilder;
use tss_esapi::constants::nv_index_type::NvIndexType;
use tss_esapi::handles::{NvIndexHandle, NvIndexTpmHandle, ObjectHandle, PersistentTpmHandle};
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::interface_types::dynamic_handles::Persistent;
use tss_esapi::interface_types::resource_handles::{Hierarchy, NvAuth, Provision};
use tss_esapi::structures::{MaxNvBuffer, NvPublicBuilder};
use tss_esapi::tcti_ldr::TctiNameConf;
use tss_esapi::traits::Marshall;

use crate::swtpm::Swtpm;

/// Where the paravisor persists its attestation key.
pub const HCL_AK_HANDLE: u32 = 0x8100_0003;
/// Where the paravisor leaves its report.
pub const HCL_REPORT_NV_INDEX: u32 = 0x0140_0001;

fn context(swtpm: &Swtpm) -> anyhow::Result<Context> {
    let tcti: TctiNameConf = swtpm.tcti().parse().context("swtpm TCTI")?;
    Context::new(tcti).context("opening the swtpm")
}

/// Persists an RSA-2048 restricted signing key (RSASSA-SHA256) at [`HCL_AK_HANDLE`] and returns
/// its `TPMT_PUBLIC`.
pub fn persist_hcl_ak(swtpm: &Swtpm) -> anyhow::Result<Vec<u8>> {
    let mut ctx = context(swtpm)?;
    let template = tpm_issuer::ak_template(tpm_issuer::AkSpec::RSA_DEFAULT)?;
    let created = ctx.execute_with_nullauth_session(|ctx| {
        ctx.create_primary(Hierarchy::Owner, template, None, None, None, None)
    })?;
    let persistent = Persistent::Persistent(PersistentTpmHandle::new(HCL_AK_HANDLE)?);
    let mut handle = ctx.execute_with_nullauth_session(|ctx| {
        ctx.evict_control(Provision::Owner, created.key_handle.into(), persistent)
    })?;
    ctx.tr_close(&mut handle)?;
    ctx.flush_context(ObjectHandle::from(created.key_handle))?;
    Ok(created.out_public.marshall()?)
}

/// Defines NV index [`HCL_REPORT_NV_INDEX`] (owner read and write, as Azure's readers use it)
/// holding `blob`.
pub fn write_hcl_report(swtpm: &Swtpm, blob: &[u8]) -> anyhow::Result<()> {
    let mut ctx = context(swtpm)?;
    let attributes = NvIndexAttributesBuilder::new()
        .with_owner_read(true)
        .with_owner_write(true)
        .with_nv_index_type(NvIndexType::Ordinary)
        .build()?;
    let public = NvPublicBuilder::new()
        .with_nv_index(NvIndexTpmHandle::new(HCL_REPORT_NV_INDEX)?)
        .with_index_name_algorithm(HashingAlgorithm::Sha256)
        .with_index_attributes(attributes)
        .with_data_area_size(blob.len())
        .build()?;
    let nv: NvIndexHandle = ctx
        .execute_with_nullauth_session(|ctx| ctx.nv_define_space(Provision::Owner, None, public))
        .context("defining the HCL report's NV index")?;
    for (i, chunk) in blob.chunks(1024).enumerate() {
        let offset = u16::try_from(i * 1024)?;
        let data = MaxNvBuffer::try_from(chunk.to_vec())?;
        ctx.execute_with_nullauth_session(|ctx| ctx.nv_write(NvAuth::Owner, nv, data, offset))
            .context("writing the HCL report")?;
    }
    Ok(())
}

/// An azure-sev-snp CVM's boot on `swtpm`: the AK persisted, and an HCL report whose SEV-SNP
/// report (signed by `vcek`, with `fields` but REPORT_DATA) binds `runtime_data`, or runtime
/// data naming the persisted AK when `None`. Returns the HCL report.
pub fn boot_snp(
    swtpm: &Swtpm,
    vcek: &SimulatedSigner,
    mut fields: ReportFields,
    runtime_data: Option<Vec<u8>>,
) -> anyhow::Result<Vec<u8>> {
    let ak = persist_hcl_ak(swtpm)?;
    let runtime = match runtime_data {
        Some(runtime) => runtime,
        None => azure_runtime_data_for_public(&ak)?,
    };
    fields.report_data = soft_issuer::azure::report_data_for(&runtime);
    let report = vcek.report(&fields)?;
    let blob =
        soft_issuer::azure::hcl_report(soft_issuer::azure::REPORT_TYPE_SNP, &report, &runtime);
    write_hcl_report(swtpm, &blob)?;
    Ok(blob)
}
