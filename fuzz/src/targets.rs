//! What each attestation fuzz target does with its input. The targets in `fuzz_targets/` call
//! these, and `lib/attestation/tests/fuzz_regressions.rs` replays every saved crash input through
//! the same functions in the normal test run, so a fixed crash stays fixed.
//!
//! Every function must return without panicking for any input: the code under test is the first
//! to touch bytes from an unauthenticated peer.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use attestation::eventlog::{EventLog, check_against_quote};
use attestation::snp::instance_info::azure_runtime_ak;
use attestation::snp::{Cert, Crl, InstanceInfo, Product, Report, Trust, certs, verify_report};
use attestation::tpm::{Attest, HashAlg, Public, Signature};
use attestation::vtpm::{
    AttestationDocument, Quote, make_extra_data, make_qualifying_data, verify_quote,
};
use attestation::{AkTrust, Measurement, Policy, QemuVtpmValidator, Validator};
use soft_issuer::{KeyType, SoftIssuer};

/// A valid quote, its qualifying data and its key, which a target mutates one part of so the
/// fuzzed bytes reach the checks behind the parser.
struct Case {
    ak_pub: Vec<u8>,
    quote: Quote,
    qualifying: Vec<u8>,
}

/// One case per key type of the software attestation key (ECC P-256 and RSA-2048).
fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        let (user_data, nonce) = ([7u8; 32], [9u8; 32]);
        let qualifying = make_qualifying_data(&[], &make_extra_data(&user_data, &nonce)).to_vec();
        [KeyType::EcdsaP256, KeyType::Rsa2048]
            .into_iter()
            .map(|key| {
                let issuer = SoftIssuer::new(key).expect("software key");
                let doc = issuer.issue_document(&user_data, &nonce).expect("document");
                let doc: AttestationDocument = serde_json::from_slice(&doc).expect("JSON");
                let att = doc.attestation.expect("attestation");
                Case {
                    ak_pub: att.ak_pub,
                    quote: att.quotes[0].clone(),
                    qualifying: qualifying.clone(),
                }
            })
            .collect()
    })
}

/// The whole qemu-vtpm validator on a document (JSON, base64, every TPM structure, signature,
/// PCR and event log check); documents that parse must also round-trip through the issuer's
/// serialisation.
pub fn document_json(data: &[u8]) {
    let policy = Policy::new(
        [(
            4,
            Measurement {
                expected: vec![0x44; 32],
                warn_only: true,
            },
        )]
        .into(),
    )
    .expect("a fixed, valid policy");
    // Any key, so that inputs whose quotes verify reach the policy comparison too.
    let _ = QemuVtpmValidator::new(policy, AkTrust::AnyKey).validate(data, b"fuzz nonce");
    if let Ok(doc) = serde_json::from_slice::<AttestationDocument>(data) {
        let json = serde_json::to_vec(&doc).expect("a parsed document serialises");
        let again: AttestationDocument =
            serde_json::from_slice(&json).expect("a serialised document parses");
        assert_eq!(doc, again);
    }
}

/// `TPMT_PUBLIC`: parsing, then use as the key of a real quote.
pub fn tpmt_public(data: &[u8]) {
    let _ = Public::parse(data);
    for case in cases() {
        let _ = verify_quote(data, &case.quote, &case.qualifying);
    }
}

/// `TPMT_SIGNATURE`: parsing, then verification over a real quote with a real key (scalar
/// padding, DER re-encoding, scheme and hash selection).
pub fn tpmt_signature(data: &[u8]) {
    let _ = Signature::parse(data);
    for case in cases() {
        let mut quote = case.quote.clone();
        quote.raw_sig = data.to_vec();
        let _ = verify_quote(&case.ak_pub, &quote, &case.qualifying);
    }
}

/// `TPMS_ATTEST`: parsing, then the quote checks with a real key and signature.
pub fn tpms_attest(data: &[u8]) {
    if let Ok(attest) = Attest::parse(data) {
        for selection in &attest.quote.pcr_select {
            let _ = selection.indices();
        }
    }
    for case in cases() {
        let mut quote = case.quote.clone();
        quote.quote = data.to_vec();
        let _ = verify_quote(&case.ak_pub, &quote, &case.qualifying);
    }
}

/// The event log: parsing either format, replaying every bank, comparing with quoted PCRs.
pub fn event_log(data: &[u8]) {
    if let Ok(log) = EventLog::parse(data) {
        for bank in [
            HashAlg::Sha1,
            HashAlg::Sha256,
            HashAlg::Sha384,
            HashAlg::Sha512,
        ] {
            let _ = log.replay(bank);
        }
    }
    let quoted: BTreeMap<u32, Vec<u8>> = (0..24).map(|i| (i, vec![0; 32])).collect();
    let _ = check_against_quote(data, HashAlg::Sha256, &quoted);
}

/// A target's body: takes the input, must not panic.
pub type Target = fn(&[u8]);

/// The attestation targets by name, as the regression test walks them.
pub const TARGETS: [(&str, Target); 19] = [
    ("document_json", document_json),
    ("tpmt_public", tpmt_public),
    ("tpmt_signature", tpmt_signature),
    ("tpms_attest", tpms_attest),
    ("event_log", event_log),
    ("snp_report", snp_report),
    ("snp_instance_info", snp_instance_info),
    ("snp_cert", snp_cert),
    ("snp_crl", snp_crl),
    ("snp_certtable", snp_certtable),
    ("tdx_quote", tdx_quote),
    ("qemu_tdx_document", qemu_tdx_document),
    ("azure_tdx_instance_info", azure_tdx_instance_info),
    (
        "azure_trustedlaunch_instance_info",
        azure_trustedlaunch_instance_info,
    ),
    ("tdx_collateral", tdx_collateral),
    ("tdx_outblob", tdx_outblob),
    ("gcp_sev_es", gcp_sev_es),
    ("aws_nitro_tpm", aws_nitro_tpm),
    ("nitro_tpm_document", nitro_tpm_document),
];

/// AWS's NitroTPM attestation document (COSE_Sign1, its CBOR payload, the certificate chain and
/// the signature), against AWS's root and, to reach every check past the root, against the root
/// the input's own `cabundle` names at the input's own timestamp; and the input as the PEM of
/// configured roots.
pub fn nitro_tpm_document(data: &[u8]) {
    use attestation::variants::aws_nitro_tpm::attestation_document::{NitroRoots, parse, verify};
    let _ = verify(data, &NitroRoots::aws(), 1_764_000_000);
    if let Ok((_, doc)) = parse(data)
        && let Some(root) = doc.cabundle.first()
        && let Ok(roots) = NitroRoots::from_der(vec![root.clone()])
        && let Ok(at) = i64::try_from(doc.timestamp_ms / 1000)
    {
        let _ = verify(data, &roots, at);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = NitroRoots::from_pem(text);
    }
}

/// aws-nitro-tpm's untrusted inputs: the node's InstanceInfo (the EC2 instance identity
/// document and the image it names) and EC2's XML answers as ec2-identity reads them.
pub fn aws_nitro_tpm(data: &[u8]) {
    use attestation::variants::aws_nitro_tpm::{IdentityDocument, ImageRef, ec2_answer};
    if let Ok(doc) = IdentityDocument::parse(data)
        && let Ok(image) = ImageRef::from_identity(&doc)
    {
        // What passes must be safe in an endpoint host and a query.
        assert!(
            image
                .region
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        );
        assert!(
            image
                .image_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        );
    }
    let _ = ec2_answer::parse_describe_images(data);
    let _ = ec2_answer::parse_error(data);
}

/// A real Milan VCEK with its ASK and ARK (bare-metal vector), for targets that need a chain.
struct Amd {
    vcek: Cert,
    ask: Cert,
    ark: Cert,
}

fn amd() -> &'static Amd {
    static AMD: OnceLock<Amd> = OnceLock::new();
    AMD.get_or_init(|| {
        let vcek = include_bytes!("../../lib/attestation/testdata/snp/milan-virtee/vcek.der");
        let chain = include_bytes!("../../lib/attestation/testdata/snp/azure-certchain.pem");
        let mut chain = attestation::snp::certs_from_pem(chain).expect("AMD's Milan chain");
        let ark = chain.pop().expect("ARK");
        let ask = chain.pop().expect("ASK");
        Amd {
            vcek: Cert::from_der(vcek.to_vec()).expect("the Milan VCEK"),
            ask,
            ark,
        }
    })
}

/// 2026-11-25: inside the real VCEK's window.
const SNP_TIME: i64 = 1_795_564_800;

/// An SNP report: the exact layout checks, every accessor for every product, then the whole
/// verification with a real VCEK and chain (which a fuzzed report never passes).
pub fn snp_report(data: &[u8]) {
    let Ok(report) = Report::parse(data) else {
        return;
    };
    for product in [Product::Milan, Product::Genoa, Product::Turin] {
        let _ = (
            report.reported_tcb(product),
            report.current_tcb(product),
            report.committed_tcb(product),
            report.launch_tcb(product),
        );
    }
    let _ = (
        report.cpuid(),
        report.signature_fixed(),
        report.chip_id_masked(),
    );
    let amd = amd();
    let _ = verify_report(
        &report,
        &amd.vcek,
        &amd.ask,
        &amd.ark,
        &Trust::builtin(),
        SNP_TIME,
    );
}

/// Constellation's SNP InstanceInfo JSON (base64 fields, PEM certificates, the report inside),
/// and Azure's runtime data JSON.
pub fn snp_instance_info(data: &[u8]) {
    if let Ok(info) = InstanceInfo::parse(data)
        && let Some(runtime) = &info.azure_runtime_data
    {
        let _ = azure_runtime_ak(runtime);
    }
    let _ = azure_runtime_ak(data);
}

/// A certificate as the verifier reads a VCEK or VLEK (DER, and as PEM), chained to AMD's real
/// Milan ASK and ARK.
pub fn snp_cert(data: &[u8]) {
    let amd = amd();
    if let Ok(cert) = Cert::from_der(data.to_vec()) {
        let _ = cert.common_name();
        let _ = certs::verify_chain(&cert, &amd.ask, &amd.ark, Trust::builtin().arks(), SNP_TIME);
    }
    let _ = attestation::snp::certs_from_pem(data);
}

/// An AMD CRL (DER): parsing, then the whole check against the real Milan chain.
pub fn snp_crl(data: &[u8]) {
    if let Ok(crl) = Crl::from_der(data.to_vec()) {
        let amd = amd();
        let _ = (crl.this_update(), crl.next_update());
        let _ = crl.check(&amd.ark, &amd.ask, &amd.vcek, SNP_TIME, 0);
    }
}

/// A guest interface that answers with a real report and the fuzzed certificate table.
#[derive(Debug)]
struct HostTable(Vec<u8>);

impl snp_issuer::ReportSource for HostTable {
    fn get_report(
        &self,
        _report_data: &[u8; 64],
    ) -> Result<snp_issuer::RawReport, snp_issuer::SnpSourceError> {
        Ok(snp_issuer::RawReport {
            report: include_bytes!(
                "../../lib/attestation/testdata/snp/constellation-aws/report.bin"
            )
            .to_vec(),
            certs: Some(self.0.clone()),
        })
    }

    fn describe(&self) -> String {
        "the fuzzer".to_owned()
    }
}

/// The host's SNP certificate table (configfs-tsm's `auxblob`, `SNP_GET_EXT_REPORT`'s buffer) as
/// the node reads it: parsing; a table that parses re-encodes to itself; then the aws-sev-snp
/// InstanceInfo built from it (PEM, the certificate checks), read back as the verifier reads it.
pub fn snp_certtable(data: &[u8]) {
    use snp_issuer::certtable::{CertTable, Guid};
    if let Ok(table) = CertTable::parse(data) {
        let entries: Vec<(Guid, &[u8])> = table
            .entries()
            .iter()
            .map(|(guid, cert)| (*guid, cert.as_slice()))
            .collect();
        let again = CertTable::parse(&CertTable::encode(&entries));
        assert_eq!(
            again.as_ref(),
            Ok(&table),
            "a parsed table must re-encode to itself"
        );
    }
    if let Ok(info) = snp_issuer::aws_instance_info(&HostTable(data.to_vec()), b"spki") {
        let _ = InstanceInfo::parse(&info);
    }
}

/// Real Intel collateral (the dcap-qvl UpToDate vector) and a time inside its window.
fn intel() -> &'static attestation::tdx::Collateral {
    static INTEL: OnceLock<attestation::tdx::Collateral> = OnceLock::new();
    INTEL.get_or_init(|| {
        attestation::tdx::Collateral::from_dcap_json(include_bytes!(
            "../../lib/attestation/testdata/tdx/dcap-qvl-uptodate/collateral.json"
        ))
        .expect("the dcap-qvl collateral")
    })
}

const TDX_TIME: i64 = 1_750_329_147;

fn tdx_verify(quote: &attestation::tdx::TdQuote) {
    let _ = (
        quote.td().measurements(),
        quote.td().is_debug(),
        quote.sept_ve_disable(),
    );
    if let Ok(verified) = attestation::tdx::verify_quote(
        quote,
        intel(),
        &attestation::tdx::Trust::builtin(),
        TDX_TIME,
    ) {
        let _ = attestation::tdx::TdxConfig::default().check(&verified);
    }
}

/// A TDX quote (v4, v5): the header and layout checks, then the whole DCAP verification with
/// real collateral (which a changed quote never passes).
pub fn tdx_quote(data: &[u8]) {
    if let Ok(quote) = attestation::tdx::TdQuote::parse(data) {
        tdx_verify(&quote);
    }
}

/// What a TDX guest's configfs-tsm returns as `outblob` (the host's quote generation service
/// makes it) as the node's TDX issuer checks it: against zeros, and against the bytes where a v4
/// and a v5 quote carry REPORT_DATA, so the accepting path is reached too. What the node takes
/// for a TD quote over some REPORT_DATA and the verifier can parse must carry that REPORT_DATA
/// for the verifier as well.
pub fn tdx_outblob(data: &[u8]) {
    let _ = tdx_issuer::check_quote(data, &[0; 64]);
    for at in [48 + 520, 48 + 6 + 520] {
        let Some(report_data) = data
            .get(at..at + 64)
            .and_then(|bytes| <[u8; 64]>::try_from(bytes).ok())
        else {
            continue;
        };
        if tdx_issuer::check_quote(data, &report_data).is_err() {
            continue;
        }
        if let Ok(quote) = attestation::tdx::TdQuote::parse(data) {
            assert_eq!(
                quote.td().report_data,
                report_data,
                "the node and the verifier read REPORT_DATA at different places"
            );
        }
    }
}

/// The qemu-tdx document `{"RawQuote", "UserData"}`.
pub fn qemu_tdx_document(data: &[u8]) {
    if let Ok((quote, _)) = attestation::variants::tdx::parse_qemu_document(data) {
        tdx_verify(&quote);
    }
}

/// The azure-tdx InstanceInfo `{"AttestationReport", "RuntimeData"}`, and its runtime data.
pub fn azure_tdx_instance_info(data: &[u8]) {
    if let Ok((quote, runtime)) = attestation::variants::tdx::parse_azure_instance_info(data) {
        let _ = azure_runtime_ak(&runtime);
        tdx_verify(&quote);
    }
}

/// The simulated Azure vTPM CA and a software RSA AK it certified, for the trusted-launch target.
struct TrustedLaunch {
    anchors: Vec<attestation::variants::azure_trustedlaunch::Anchor>,
    ak: Public,
}

fn trusted_launch() -> &'static TrustedLaunch {
    static TL: OnceLock<TrustedLaunch> = OnceLock::new();
    TL.get_or_init(|| {
        use attestation::variants::azure_trustedlaunch::Anchor;
        let azure = soft_issuer::azure_vtpm::SimulatedAzureVtpmCa::new().expect("simulated Azure");
        let ak = SoftIssuer::new(KeyType::Rsa2048).expect("software key");
        let mut anchors = Anchor::from_pem(azure.root_pem().as_bytes()).expect("the root");
        anchors.extend(attestation::variants::azure_trustedlaunch::builtin_roots());
        TrustedLaunch {
            anchors,
            ak: Public::parse(ak.ak_public()).expect("the AK"),
        }
    })
}

/// azure-trustedlaunch's InstanceInfo `{"AkCert", "CA"}`: JSON, base64, both certificates, the
/// AK certificate's caIssuers URLs (which a node fetches), then the whole chain check against
/// the simulated Azure root and the built-in one, and the key comparison with a real RSA AK.
/// What parses must round-trip.
pub fn azure_trustedlaunch_instance_info(data: &[u8]) {
    use attestation::variants::azure_trustedlaunch::{InstanceInfo, ak_cert};
    let Ok(info) = InstanceInfo::parse(data) else {
        return;
    };
    assert_eq!(
        InstanceInfo::parse(&info.to_json()).expect("what parsed parses again"),
        info
    );
    let _ = ak_cert::ca_issuer_urls(&info.ak_cert);
    let tl = trusted_launch();
    let _ = ak_cert::verify(&info, &tl.ak, &tl.anchors, TRUSTED_LAUNCH_TIME);
}

/// 2026-11-30: inside the windows of the seeds' simulated AK certificate and CA, so a seed passes
/// every check and mutations start from an accepted chain.
const TRUSTED_LAUNCH_TIME: i64 = 1_796_000_000;

/// Intel collateral as the verifier reads it (dcap-qvl's JSON, and PCS's TCB info and QE
/// identity bodies), then used to verify the real quote.
pub fn tdx_collateral(data: &[u8]) {
    let quote = include_bytes!("../../lib/attestation/testdata/tdx/dcap-qvl-uptodate/quote.bin");
    let Ok(quote) = attestation::tdx::TdQuote::parse(quote) else {
        return;
    };
    let pcs = |tcb_info: &[u8], qe_identity: &[u8]| {
        attestation::tdx::collateral::Collateral::from_pcs(
            attestation::tdx::collateral::PcsResponses {
                tcb_info,
                tcb_info_issuer_chain: "",
                qe_identity,
                qe_identity_issuer_chain: "",
                pck_crl: data,
                pck_crl_issuer_chain: "",
                root_ca_crl: data,
            },
        )
    };
    let _ = pcs(data, data);
    if let Ok(collateral) = attestation::tdx::Collateral::from_dcap_json(data) {
        let _ = attestation::tdx::verify_quote(
            &quote,
            &collateral,
            &attestation::tdx::Trust::builtin(),
            TDX_TIME,
        );
    }
}

/// A gcp-sev-es node whose key a static GCE API vouches for, and that API.
struct GceCase {
    node: soft_issuer::gce::GceSevEsNode,
    validator: attestation::GcpSevEsValidator,
}

fn gce_case() -> &'static GceCase {
    use attestation::gce::{ConfidentialCompute, InstanceRef, StaticGceIdentity};
    static CASE: OnceLock<GceCase> = OnceLock::new();
    CASE.get_or_init(|| {
        let instance = InstanceRef {
            project: "my-project-1".to_owned(),
            zone: "us-central1-a".to_owned(),
            instance: "worker-1".to_owned(),
        };
        let node = soft_issuer::gce::GceSevEsNode::new(
            SoftIssuer::new(KeyType::EcdsaP256).expect("software key"),
            &instance,
            1,
            soft_issuer::gce::technology::AMD_SEV,
        )
        .expect("node");
        let gce = StaticGceIdentity::new()
            .with_key(instance.clone(), node.ak_spki_der().expect("SPKI"))
            .with_confidential_compute(
                instance,
                ConfidentialCompute {
                    enabled: true,
                    instance_type: String::new(),
                },
            );
        let policy = Policy::new(
            [(
                0,
                Measurement {
                    expected: node.ak().pcrs()[&0].clone(),
                    warn_only: false,
                },
            )]
            .into_iter()
            .collect(),
        )
        .expect("policy");
        let validator =
            attestation::GcpSevEsValidator::new(policy).with_gce_identity(std::sync::Arc::new(gce));
        GceCase { node, validator }
    })
}

/// gcp-sev-es: the InstanceInfo (GCEInstanceInfo JSON and the instance it names), the GCE API's
/// answers gce-identity reads (getShieldedInstanceIdentity, instances.get), the platform record
/// of an event log, and the whole validator on a document carrying the input as its
/// InstanceInfo (the quote binds it, so the checks behind the parser run).
pub fn gcp_sev_es(data: &[u8]) {
    use attestation::gce::{ConfidentialCompute, GceInstance, platform};
    if let Ok(instance) = GceInstance::parse(data) {
        let _ = attestation::gce::InstanceRef::from_instance_info(&instance);
        let _ = GceInstance::parse(&instance.to_json());
    }
    let _ = attestation::variants::gcp_sev_es::instance_of(data);
    if let Ok(config) = ConfidentialCompute::from_instance_json(data) {
        let _ = config.check_sev();
    }
    let _ = attestation::gce::signing_key_from_identity_json(data);
    if let Ok(log) = EventLog::parse(data) {
        for bank in [
            HashAlg::Sha1,
            HashAlg::Sha256,
            HashAlg::Sha384,
            HashAlg::Sha512,
        ] {
            if let Ok(state) = platform::platform_state(&log, bank) {
                let _ = platform::check_sev(&state);
            }
        }
    }
    let case = gce_case();
    let node = case.node.clone().with_instance_info(data.to_vec());
    let (user_data, nonce) = ([7u8; 32], [9u8; 32]);
    if let Ok(document) = attestation::Issuer::issue(&node, &user_data, &nonce) {
        let _ = case.validator.validate(&document, &nonce);
    }
}
