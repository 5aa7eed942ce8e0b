//! The service attests itself on SEV-SNP and TDX hardware (simulated): its certificate carries
//! the vendor collateral for its own document (ARCHITECTURE.md, "The service attests itself"),
//! and a node with a service policy checks both with the ordinary validators, against the root
//! in its policy and within the staleness it allows. Each refusal names its check.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use atls::server_collateral::{ServerCollateral, gather};
use atls::server_evidence::certify;
use atls::{
    Acceptor, Connector, HandshakeError, ServerCredential, ServerKey, ServerPolicy,
    ServerVerifyError, Window,
};
use attestation::snp::{Product, SigningKey, SnpCollateral, StaticCollateral, Tcb};
use attestation::variants::sev_snp::{Binding, SevSnpValidator};
use attestation::{Issuer, Variant};
use common::handshake::{NodeIssuer, join_once};
use soft_issuer::SoftIssuer;
use soft_issuer::snp::{ReportFields, SimulatedAmd, SnpDocumentIssuer};

const TCB: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};
/// The serial of the service's VLEK, so a CRL can name it.
const VLEK_SERIAL: u8 = 0x55;
const DAY: Duration = Duration::from_secs(86_400);

fn unix(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// The control-plane node: a vTPM quoting PCR 4 = 0x44.., on an AWS guest of `amd`'s chip.
struct SnpMachine {
    amd: SimulatedAmd,
    /// Documents carry the VLEK and its chain.
    with_chain: SnpDocumentIssuer,
    /// Documents carry the VLEK only (the host's table had no ASVK): the ASVK comes from the
    /// collateral.
    without_chain: SnpDocumentIssuer,
}

fn snp_machine() -> SnpMachine {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd
        .vlek_with_serial("CN=cc-eu-west-1.amazonaws.com", TCB, VLEK_SERIAL)
        .unwrap();
    let ak = SoftIssuer::ecdsa_p256()
        .unwrap()
        .with_pcrs([(4, [0x44; 32])])
        .unwrap();
    let with_chain = SnpDocumentIssuer::aws(
        ak.clone(),
        &vlek,
        &amd.vlek_chain_pem(),
        ReportFields::default(),
    )
    .unwrap();
    let mut info: serde_json::Value = serde_json::from_slice(with_chain.instance_info()).unwrap();
    info["CertChain"] = serde_json::Value::Null;
    let without_chain =
        SnpDocumentIssuer::from_parts(Variant::AwsSevSnp, ak, serde_json::to_vec(&info).unwrap());
    SnpMachine {
        amd,
        with_chain,
        without_chain,
    }
}

/// What attest-proxy's KDS cache would hold for `amd`: its CRL (revoking `revoked`, current
/// from `this_update` to `next_update`) and its intermediates.
fn kds(amd: &SimulatedAmd, revoked: &[u8], this_update: u64, next_update: u64) -> StaticCollateral {
    let crl = attestation::snp::Crl::from_der(amd.crl(revoked, this_update, next_update).unwrap())
        .unwrap();
    let cert = |der: &[u8]| attestation::snp::Cert::from_der(der.to_vec()).unwrap();
    StaticCollateral::new()
        .with_crl(amd.product(), crl)
        .with_intermediate(amd.product(), SigningKey::Vlek, cert(amd.asvk_der()))
        .with_intermediate(amd.product(), SigningKey::Vcek, cert(amd.ask_der()))
}

fn current_kds(amd: &SimulatedAmd) -> StaticCollateral {
    let now = unix(SystemTime::now());
    kds(amd, &[], now - 3600, now + 7 * 86_400)
}

/// What attest-proxy does with a document from its certifier: certify a fresh key, gather the
/// collateral for the document from `source`, and build the certificate carrying both.
fn attest(issuer: &dyn Issuer, source: &dyn SnpCollateral) -> ServerCredential {
    let now = SystemTime::now();
    let key = ServerKey::generate(Window::for_rotation_at(now)).unwrap();
    let document = certify(issuer, key.spki(), key.window(), now).unwrap();
    let collateral = gather(issuer.variant(), &document, Some(source), None)
        .unwrap()
        .unwrap();
    key.with_evidence_and_collateral(issuer.variant(), document, &collateral)
        .unwrap()
}

/// The node's service policy: PCR 4 = `pcr4`, [`TCB`] at least, `root`'s ARK the only trusted
/// one, collateral accepted `max_stale` past its nextUpdate.
fn snp_policy(root: &SimulatedAmd, pcr4: [u8; 32], max_stale: Duration) -> ServerPolicy {
    let config = serde_json::json!({
        "measurements": {"4": {"expected": hex::encode(pcr4), "warnOnly": false}},
        "bootloaderVersion": TCB.bootloader, "teeVersion": TCB.tee,
        "snpVersion": TCB.snp, "microcodeVersion": TCB.microcode,
        "amdRootKey": root.ark_pem(),
    });
    let (validator, _) = SevSnpValidator::from_attestation_config(
        Binding::Aws,
        config.to_string().as_bytes(),
        Arc::new(StaticCollateral::new()),
    )
    .unwrap();
    ServerPolicy::amd(validator, max_stale)
}

fn good_snp_policy(machine: &SnpMachine) -> ServerPolicy {
    snp_policy(&machine.amd, [0x44; 32], DAY)
}

/// One real handshake over loopback from a node with `policy` to a server presenting
/// `credential`: the node's request, echoed, when the node accepts the server, and whether the
/// server completed its handshake (and so received the node's certificate).
async fn connect(
    credential: ServerCredential,
    policy: ServerPolicy,
) -> (Result<Vec<u8>, HandshakeError>, bool) {
    let acceptor = Arc::new(Acceptor::with_credential(credential));
    let connector = Connector::new(Arc::new(NodeIssuer::default())).with_server_policy(policy);
    let (reply, accepted) = join_once(acceptor, &connector).await;
    (reply, accepted.is_ok())
}

/// The policy refuses `credential` with `check`; returns the error.
fn refused(policy: &ServerPolicy, credential: &ServerCredential, check: &str) -> ServerVerifyError {
    let error = policy
        .verify(credential.certificate().as_ref(), SystemTime::now())
        .unwrap_err();
    assert_eq!(
        error.check(),
        check,
        "{}",
        attestation::audit::chain(&error)
    );
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_accepts_an_aws_sev_snp_service_with_the_collateral_its_certificate_carries() {
    let machine = snp_machine();
    let credential = attest(&machine.with_chain, &current_kds(&machine.amd));
    let (reply, server_accepted) = connect(credential, good_snp_policy(&machine)).await;
    assert_eq!(reply.unwrap(), b"request");
    assert!(server_accepted);

    // A document without the ASVK: the certificate carries it too, and it verifies.
    let credential = attest(&machine.without_chain, &current_kds(&machine.amd));
    let verified = good_snp_policy(&machine)
        .verify(credential.certificate().as_ref(), SystemTime::now())
        .unwrap();
    assert_eq!(verified.variant, Variant::AwsSevSnp);
    assert!(
        verified.notes[0].contains("VLEK of CN=cc-eu-west-1.amazonaws.com"),
        "{:?}",
        verified.notes
    );
}

/// What a Go node checks of a certificate (its dates and self-signature, no unknown critical
/// extension), done by a foreign X.509 implementation: the evidence and collateral extensions
/// change nothing for it, and the certificate fits one TLS handshake message with room to spare.
async fn go_nodes_accept(credential: ServerCredential) {
    let size = credential.certificate().as_ref().len();
    assert!(size < 48 * 1024, "{size} bytes");
    for version in ["-tls1_3", "-tls1_2"] {
        let printed = common::openssl::go_style_check(credential.clone(), version).await;
        assert!(
            printed.contains("Verify return code: 0 (ok)"),
            "{version}: {printed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_nodes_accept_an_snp_service_certificate_with_its_collateral() {
    let machine = snp_machine();
    go_nodes_accept(attest(&machine.without_chain, &current_kds(&machine.amd))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_snp_service_gets_nothing_from_the_node() {
    let machine = snp_machine();
    let credential = attest(&machine.with_chain, &current_kds(&machine.amd));
    let (reply, server_accepted) =
        connect(credential, snp_policy(&machine.amd, [0x45; 32], DAY)).await;
    match reply {
        Err(HandshakeError::ServerRefused { source, .. }) => {
            assert_eq!(source.check(), "measurements", "{source}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        !server_accepted,
        "the refused server must not complete a handshake (it would hold the node's evidence)"
    );
}

#[test]
fn a_node_refuses_an_snp_service_with_other_measurements() {
    let machine = snp_machine();
    let credential = attest(&machine.with_chain, &current_kds(&machine.amd));
    refused(
        &snp_policy(&machine.amd, [0x45; 32], DAY),
        &credential,
        "measurements",
    );
}

#[test]
fn a_node_refuses_collateral_chained_to_another_amd() {
    let machine = snp_machine();
    let impostor = SimulatedAmd::impostor(Product::Milan).unwrap();
    // The document leaves the ASVK to the collateral, which names another AMD's.
    let credential = attest(&machine.without_chain, &current_kds(&impostor));
    let error = refused(&good_snp_policy(&machine), &credential, "snp_chain");
    assert!(
        attestation::audit::chain(&error).contains("AMD certificate chain"),
        "{error}"
    );
    // The document carries its own chain; the CRL is another AMD's.
    let credential = attest(&machine.with_chain, &current_kds(&impostor));
    let error = refused(&good_snp_policy(&machine), &credential, "snp_crl");
    assert!(
        attestation::audit::chain(&error).contains("AMD CRL: its signature"),
        "{}",
        attestation::audit::chain(&error)
    );
    // And a node whose policy trusts another AMD refuses the genuine service.
    let credential = attest(&machine.with_chain, &current_kds(&machine.amd));
    refused(
        &snp_policy(&impostor, [0x44; 32], DAY),
        &credential,
        "snp_chain",
    );
}

#[test]
fn a_node_refuses_an_snp_service_whose_bundled_crl_revokes_its_vlek() {
    let machine = snp_machine();
    let now = unix(SystemTime::now());
    let revoking = kds(&machine.amd, &[VLEK_SERIAL], now - 3600, now + 86_400);
    let credential = attest(&machine.with_chain, &revoking);
    let error = refused(&good_snp_policy(&machine), &credential, "snp_revoked");
    assert!(
        attestation::audit::chain(&error).contains("SEV-VLEK"),
        "{}",
        attestation::audit::chain(&error)
    );
}

/// The service's KDS cache holds AMD's two CRLs; the ASVK (serial 3) is revoked on the VLEK
/// chain's only. The service ships the VLEK chain's CRL for its VLEK-signed report, and the node
/// refuses the service.
#[test]
fn a_node_refuses_an_aws_service_whose_asvk_is_revoked_on_the_vlek_crl() {
    let machine = snp_machine();
    let now = unix(SystemTime::now());
    let crl = |serials: &[u8]| {
        attestation::snp::Crl::from_der(machine.amd.crl(serials, now - 3600, now + 86_400).unwrap())
            .unwrap()
    };
    let source = current_kds(&machine.amd)
        .with_crl_for(Product::Milan, SigningKey::Vcek, crl(&[]))
        .with_crl_for(Product::Milan, SigningKey::Vlek, crl(&[3]));
    for issuer in [&machine.with_chain, &machine.without_chain] {
        let credential = attest(issuer, &source);
        let error = refused(&good_snp_policy(&machine), &credential, "snp_revoked");
        let chain = attestation::audit::chain(&error);
        assert!(chain.contains("SEV-VLEK-Milan"), "{chain}");
    }
}

#[test]
fn a_node_refuses_snp_collateral_stale_beyond_its_allowance() {
    let machine = snp_machine();
    let now = unix(SystemTime::now());
    // The CRL's nextUpdate passed two hours ago (AMD unreachable, the service's cache serving
    // what it has).
    let stale = kds(&machine.amd, &[], now - 3 * 86_400, now - 2 * 3600);
    let credential = attest(&machine.with_chain, &stale);
    let error = refused(
        &snp_policy(&machine.amd, [0x44; 32], Duration::from_secs(3600)),
        &credential,
        "snp_crl",
    );
    assert!(
        attestation::audit::chain(&error).contains("not current at the verification time"),
        "{}",
        attestation::audit::chain(&error)
    );
    // Within a node's larger allowance it is accepted.
    snp_policy(&machine.amd, [0x44; 32], Duration::from_secs(3 * 3600))
        .verify(credential.certificate().as_ref(), SystemTime::now())
        .unwrap();
}

#[test]
fn a_node_refuses_an_snp_service_without_collateral() {
    let machine = snp_machine();
    let now = SystemTime::now();
    let key = ServerKey::generate(Window::for_rotation_at(now)).unwrap();
    let document = certify(&machine.with_chain, key.spki(), key.window(), now).unwrap();
    let credential = key.with_evidence(Variant::AwsSevSnp, document).unwrap();
    let error = refused(
        &good_snp_policy(&machine),
        &credential,
        "server_collateral_missing",
    );
    assert!(
        error
            .to_string()
            .contains("carries no AMD collateral (extension 1.3.9900.99.1)"),
        "{error}"
    );
}

#[test]
fn a_node_refuses_snp_evidence_made_for_another_key() {
    let machine = snp_machine();
    let now = SystemTime::now();
    let genuine = ServerKey::generate(Window::for_rotation_at(now)).unwrap();
    let document = certify(&machine.with_chain, genuine.spki(), genuine.window(), now).unwrap();
    let collateral = gather(
        Variant::AwsSevSnp,
        &document,
        Some(&current_kds(&machine.amd)),
        None,
    )
    .unwrap()
    .unwrap();
    let impostor = ServerKey::generate(genuine.window())
        .unwrap()
        .with_evidence_and_collateral(Variant::AwsSevSnp, document, &collateral)
        .unwrap();
    // The nonce covers the key's hash, so the vTPM quote fails for the impostor's key.
    refused(&good_snp_policy(&machine), &impostor, "nonce");
}

#[test]
fn collateral_of_the_wrong_vendor_or_shape_is_refused_by_name() {
    let machine = snp_machine();
    let credential = attest(&machine.with_chain, &current_kds(&machine.amd));
    let (_, cert) = x509_parser::parse_x509_certificate(credential.certificate().as_ref()).unwrap();
    let bytes = atls::server_collateral::find_collateral(&cert).unwrap();
    let decoded = ServerCollateral::decode(bytes).unwrap();
    assert_eq!(decoded.vendor(), "AMD");
    assert_eq!(decoded.encode().unwrap(), bytes, "encoding round-trips");

    for (bad, needle) in [
        (&b"{}"[..], "not {\"amd\": ...} or {\"intel\": ...}"),
        (br#"{"amd": {"crl": "!!"}}"#, "crl is not standard base64"),
        (br#"{"amd": {"crl": "AAAA"}}"#, "crl: AMD CRL"),
        (br#"{"amd": {"crl": "", "extra": 1}}"#, "unknown field"),
        (br#"{"intel": {"tcb_info": 1}}"#, "intel: Intel collateral"),
    ] {
        let error = ServerCollateral::decode(bad).unwrap_err();
        assert!(error.to_string().contains(needle), "{needle}: {error}");
    }
    let huge = vec![b' '; atls::server_collateral::MAX_SERVER_COLLATERAL + 1];
    assert!(
        ServerCollateral::decode(&huge)
            .unwrap_err()
            .to_string()
            .contains("more than the limit")
    );
}

// TDX: a qemu-tdx service on a simulated TDX machine certified by a simulated Intel.

mod tdx {
    use super::*;

    use attestation::tdx::collateral::PcsResponses;
    use attestation::tdx::{Collateral, StaticCollateral as TdxStatic};
    use attestation::variants::tdx::{TdxKind, TdxValidator};
    use pcs_standin::SimulatedIntel;
    use soft_issuer::tdx::{
        MRSEAM, MRTD, PckSpec, RTMRS, ReportData, TdFields, TdxDocumentIssuer, TdxMachine,
    };

    struct TdxSite {
        intel: SimulatedIntel,
        machine: Arc<TdxMachine>,
        service: TdxDocumentIssuer,
    }

    fn site() -> TdxSite {
        let intel = SimulatedIntel::new().unwrap();
        let machine = Arc::new(TdxMachine::new(&intel, PckSpec::default()).unwrap());
        let service =
            TdxDocumentIssuer::qemu(machine.clone(), TdFields::default(), ReportData::Bound);
        TdxSite {
            intel,
            machine,
            service,
        }
    }

    /// What attest-proxy's PCS cache would hold: `intel`'s collateral for the machine, issued
    /// at `issued`, due at `next`.
    fn pcs(intel: &SimulatedIntel, machine: &TdxMachine, issued: u64, next: u64) -> TdxStatic {
        let at = |secs: u64| UNIX_EPOCH + Duration::from_secs(secs);
        let (issued, next) = (at(issued), at(next));
        let ca = machine.pck().ca;
        let tcb = intel
            .signed_tcb_info(&machine.fmspc_hex(), issued, next)
            .unwrap();
        let qe = intel
            .sign_qe_identity(&intel.qe_identity_json(issued, next).unwrap())
            .unwrap();
        let chain = intel.tcb_issuer_chain_pem();
        TdxStatic::new().with(
            Collateral::from_pcs(PcsResponses {
                tcb_info: tcb.as_bytes(),
                tcb_info_issuer_chain: &chain,
                qe_identity: qe.as_bytes(),
                qe_identity_issuer_chain: &chain,
                pck_crl: &intel.pck_crl(ca, &[], issued, next).unwrap(),
                pck_crl_issuer_chain: &intel.pck_issuer_chain_pem(ca),
                root_ca_crl: &intel.root_crl(&[], issued, next).unwrap(),
            })
            .unwrap(),
        )
    }

    fn current_pcs(site: &TdxSite) -> TdxStatic {
        let now = unix(SystemTime::now());
        pcs(&site.intel, &site.machine, now - 3600, now + 86_400)
    }

    fn attest_tdx(issuer: &dyn Issuer, source: &TdxStatic) -> ServerCredential {
        let now = SystemTime::now();
        let key = ServerKey::generate(Window::for_rotation_at(now)).unwrap();
        let document = certify(issuer, key.spki(), key.window(), now).unwrap();
        let collateral = gather(issuer.variant(), &document, None, Some(source))
            .unwrap()
            .unwrap();
        key.with_evidence_and_collateral(issuer.variant(), document, &collateral)
            .unwrap()
    }

    /// The node's qemu-tdx service policy: MRTD = `mrtd`, the RTMRs of the simulated TD, `root`
    /// the only trusted Intel root.
    fn tdx_policy(root: &SimulatedIntel, mrtd: [u8; 48], max_stale: Duration) -> ServerPolicy {
        let mut measurements = serde_json::Map::new();
        for (i, value) in std::iter::once(mrtd).chain(RTMRS).enumerate() {
            measurements.insert(
                i.to_string(),
                serde_json::json!({ "expected": hex::encode(value), "warnOnly": false }),
            );
        }
        let config = serde_json::json!({
            "measurements": measurements, "intelRootKey": root.root_pem(),
            "mrSeams": [hex::encode(MRSEAM)],
        });
        let (validator, _) = TdxValidator::from_attestation_config(
            TdxKind::Qemu,
            config.to_string().as_bytes(),
            Arc::new(TdxStatic::new()),
        )
        .unwrap();
        ServerPolicy::intel(validator, max_stale)
    }

    fn good_tdx_policy(site: &TdxSite) -> ServerPolicy {
        tdx_policy(&site.intel, MRTD, DAY)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_accepts_a_qemu_tdx_service_with_the_collateral_its_certificate_carries() {
        let site = site();
        let credential = attest_tdx(&site.service, &current_pcs(&site));
        let (reply, server_accepted) = connect(credential.clone(), good_tdx_policy(&site)).await;
        assert_eq!(reply.unwrap(), b"request");
        assert!(server_accepted);
        let verified = good_tdx_policy(&site)
            .verify(credential.certificate().as_ref(), SystemTime::now())
            .unwrap();
        assert_eq!(verified.variant, Variant::QemuTdx);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn go_nodes_accept_a_tdx_service_certificate_with_its_collateral() {
        let site = site();
        go_nodes_accept(attest_tdx(&site.service, &current_pcs(&site))).await;
    }

    #[test]
    fn a_node_refuses_a_tdx_service_with_another_mrtd_or_rtmr() {
        let site = site();
        let credential = attest_tdx(&site.service, &current_pcs(&site));
        refused(
            &tdx_policy(&site.intel, [0x5d; 48], DAY),
            &credential,
            "measurements",
        );
        let other_rtmr = TdxDocumentIssuer::qemu(
            site.machine.clone(),
            TdFields {
                rtmrs: [[0x77; 48]; 4],
                ..TdFields::default()
            },
            ReportData::Bound,
        );
        let credential = attest_tdx(&other_rtmr, &current_pcs(&site));
        refused(&good_tdx_policy(&site), &credential, "measurements");
    }

    #[test]
    fn a_node_refuses_tdx_collateral_of_another_intel() {
        let site = site();
        let impostor = SimulatedIntel::new().unwrap();
        let now = unix(SystemTime::now());
        let forged = pcs(&impostor, &site.machine, now - 3600, now + 86_400);
        let credential = attest_tdx(&site.service, &forged);
        let error = policy_refusal(&good_tdx_policy(&site), &credential);
        // The TCB signing chain of the collateral ends in a root the node does not trust.
        assert_eq!(
            error.check(),
            "tdx_chain",
            "{}",
            attestation::audit::chain(&error)
        );
        assert!(
            attestation::audit::chain(&error).contains("is not one the configuration trusts"),
            "{}",
            attestation::audit::chain(&error)
        );
        // And a node trusting another Intel refuses the genuine service at its PCK chain.
        let credential = attest_tdx(&site.service, &current_pcs(&site));
        refused(&tdx_policy(&impostor, MRTD, DAY), &credential, "tdx_chain");
    }

    #[test]
    fn a_node_refuses_tdx_collateral_stale_beyond_its_allowance() {
        let site = site();
        let now = unix(SystemTime::now());
        let stale = pcs(&site.intel, &site.machine, now - 3 * 86_400, now - 2 * 3600);
        let credential = attest_tdx(&site.service, &stale);
        refused(
            &tdx_policy(&site.intel, MRTD, Duration::from_secs(3600)),
            &credential,
            "tdx_collateral_not_current",
        );
        tdx_policy(&site.intel, MRTD, Duration::from_secs(3 * 3600))
            .verify(credential.certificate().as_ref(), SystemTime::now())
            .unwrap();
    }

    #[test]
    fn a_node_refuses_a_tdx_service_without_collateral_or_with_amds() {
        let site = site();
        let now = SystemTime::now();
        let key = ServerKey::generate(Window::for_rotation_at(now)).unwrap();
        let document = certify(&site.service, key.spki(), key.window(), now).unwrap();
        let bare = key
            .with_evidence(Variant::QemuTdx, document.clone())
            .unwrap();
        let error = refused(&good_tdx_policy(&site), &bare, "server_collateral_missing");
        assert!(error.to_string().contains("no Intel collateral"), "{error}");

        let amd = SimulatedAmd::new(Product::Milan).unwrap();
        let amds = gather(
            Variant::AwsSevSnp,
            &snp_machine_document(),
            Some(&current_kds(&amd)),
            None,
        )
        .unwrap()
        .unwrap();
        let key = ServerKey::generate(Window::for_rotation_at(now)).unwrap();
        let document = certify(&site.service, key.spki(), key.window(), now).unwrap();
        let mixed = key
            .with_evidence_and_collateral(Variant::QemuTdx, document, &amds)
            .unwrap();
        let error = refused(
            &good_tdx_policy(&site),
            &mixed,
            "server_collateral_malformed",
        );
        assert!(
            attestation::audit::chain(&error).contains("it holds AMD collateral"),
            "{}",
            attestation::audit::chain(&error)
        );
    }

    #[test]
    fn intel_collateral_round_trips_through_the_extension() {
        let site = site();
        let credential = attest_tdx(&site.service, &current_pcs(&site));
        let (_, cert) =
            x509_parser::parse_x509_certificate(credential.certificate().as_ref()).unwrap();
        let bytes = atls::server_collateral::find_collateral(&cert).unwrap();
        let ServerCollateral::Intel(collateral) = ServerCollateral::decode(bytes).unwrap() else {
            panic!("expected Intel collateral");
        };
        assert_eq!(
            collateral.fmspc().to_vec(),
            hex::decode(site.machine.fmspc_hex()).unwrap()
        );
        assert_eq!(
            ServerCollateral::Intel(collateral).encode().unwrap(),
            bytes,
            "encoding round-trips"
        );
    }
}

/// An aws-sev-snp document of a fresh simulated machine, for a certificate of another variant.
fn snp_machine_document() -> Vec<u8> {
    snp_machine().with_chain.issue(&[0; 32], &[0; 32]).unwrap()
}

/// The policy refuses `credential`; returns the error, whatever its check.
fn policy_refusal(policy: &ServerPolicy, credential: &ServerCredential) -> ServerVerifyError {
    policy
        .verify(credential.certificate().as_ref(), SystemTime::now())
        .unwrap_err()
}
