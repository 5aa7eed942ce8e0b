//! `attest-tool policy --document`: a complete attestation config derived from a document a node
//! made (`join-client attest`), in the format attest-proxy reads, so that no value is copied by
//! hand.
//!
//! What the document shows becomes a pin: every PCR of the quote of the strongest bank (SHA-256
//! before SHA-384 and SHA-512; SHA-1 is never compared), enforced; qemu-vtpm's attestation key;
//! on SEV-SNP the node's TCB as the minimum for its product, the launch MEASUREMENT, the ID and
//! author key digests, HOST_DATA and whether SMT is on; on TDX the MRTD and RTMRs, MRSEAM, XFAM,
//! the QE vendor and the SVNs as minimums. What a document cannot show (the TCB status Intel
//! will give the platform, the GCP projects of the fleet) is taken from options or left to the
//! operator, and each [`Derived::notes`] entry says which. Several nodes' documents give one
//! config for all of them (`merge`). Chip IDs are pinned only on request: a policy is for a
//! fleet, not one machine.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, bail};
use attestation::snp::config::policy_bits;
use attestation::snp::{InstanceInfo, Product, Report, SnpConfig, Tcb};
use attestation::tdx::TdQuote;
use attestation::tpm::HashAlg;
use attestation::variants::sev_snp::{Binding, SevSnpValidator};
use attestation::variants::tdx::{TdxKind, TdxValidator, parse_azure_instance_info};
use attestation::vtpm::document::AttestationDocument;
use attestation::{QemuVtpmConfig, Variant};
use serde::ser::{SerializeMap, Serializer};
use serde_json::{Value, json};

/// What the operator decides that a document cannot show.
#[derive(Clone, Debug, Default)]
pub struct DeriveOptions {
    /// SEV-SNP: pin this machine's CHIP_ID (`allowedChipIds`).
    pub pin_chip_id: bool,
    /// gcp-sev-snp: `allowedGcpProjects`.
    pub gcp_projects: Vec<String>,
    /// TDX: `acceptedTcbStatuses`; `["UpToDate"]` when empty.
    pub tcb_statuses: Vec<String>,
    /// SEV-SNP: `amdRootKey` (PEM), for an AMD root other than AMD's built-in ones.
    pub amd_root_key: Option<String>,
    /// TDX: `intelRootKey` (PEM), for an Intel root other than the built-in one.
    pub intel_root_key: Option<String>,
    /// The nodes' service policy (join-client `--service-policy`) from a control-plane node's
    /// document, rather than the join service's policy for nodes.
    pub service_policy: bool,
}

/// A derived attestation config and what the operator must still decide.
#[derive(Debug)]
pub struct Derived {
    /// The config, as attest-proxy (or join-client, for a service policy) reads it.
    pub json: String,
    /// The digest the config's audit lines name.
    pub digest: String,
    /// What could not come from the document, and what was chosen for it.
    pub notes: Vec<String>,
}

/// The config being built: measurements first (in register order), then the variant's fields.
struct Config {
    measurements: BTreeMap<u32, (Vec<u8>, bool)>,
    fields: serde_json::Map<String, Value>,
}

impl serde::Serialize for Config {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1 + self.fields.len()))?;
        map.serialize_entry("measurements", &Ordered(&self.measurements))?;
        for (key, value) in &self.fields {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// Measurements in register order (a JSON map keyed by strings would put "10" before "2").
struct Ordered<'a>(&'a BTreeMap<u32, (Vec<u8>, bool)>);

impl serde::Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (index, (value, warn_only)) in self.0 {
            map.serialize_entry(
                &index.to_string(),
                &json!({"expected": hex::encode(value), "warnOnly": warn_only}),
            )?;
        }
        map.end()
    }
}

impl Config {
    fn new() -> Config {
        Config {
            measurements: BTreeMap::new(),
            fields: serde_json::Map::new(),
        }
    }

    fn set(&mut self, key: &str, value: Value) {
        self.fields.insert(key.to_owned(), value);
    }

    fn to_json(&self) -> anyhow::Result<String> {
        Ok(serde_json::to_string_pretty(self)?)
    }
}

/// Derives `variant`'s attestation config from `documents`, each a node's (`name` names it in
/// errors): one config that admits every one of them (see `merge`).
pub fn derive(
    variant: Variant,
    documents: &[(String, Vec<u8>)],
    options: &DeriveOptions,
) -> anyhow::Result<Derived> {
    check_options(variant, options)?;
    let mut ones = Vec::new();
    for (name, document) in documents {
        let one = derive_one(variant, document, options).with_context(|| name.clone())?;
        ones.push((name.as_str(), one));
    }
    let ones_ref: Vec<(&str, &One)> = ones.iter().map(|(n, o)| (*n, o)).collect();
    let (config, mut notes) = merge(&ones_ref)?;
    let json = config.to_json()?;
    let digest = load(variant, json.as_bytes())
        .context("the derived config does not load as attest-proxy loads it")?;
    // The SNP checks the service runs on each report must pass with the merged settings.
    let snp = matches!(
        variant,
        Variant::AwsSevSnp | Variant::AzureSevSnp | Variant::GcpSevSnp
    )
    .then(|| SnpConfig::for_variant(variant, json.as_bytes()))
    .transpose()
    .context("the derived SNP settings")?;
    for (name, one) in &ones {
        if let (Some(snp), Some((report, product))) = (&snp, &one.snp) {
            snp.check_report(report, *product)
                .with_context(|| format!("the derived SNP settings refuse the report of {name}"))?;
        }
    }
    if options.service_policy {
        notes.push(format!(
            "this is the nodes' service policy: give it to join-client as --service-policy FILE --service-variant {variant}"
        ));
    }
    Ok(Derived {
        json,
        digest,
        notes,
    })
}

/// What one document shows.
struct One {
    config: Config,
    notes: Vec<String>,
    /// SEV-SNP: the report and its product.
    snp: Option<(Report, Product)>,
}

/// Refuses options that do not apply to `variant`.
fn check_options(variant: Variant, options: &DeriveOptions) -> anyhow::Result<()> {
    if options.service_policy {
        match variant {
            Variant::QemuVtpm
            | Variant::AwsSevSnp
            | Variant::AzureSevSnp
            | Variant::QemuTdx
            | Variant::AzureTdx => {}
            Variant::GcpSevSnp => bail!(
                "a gcp-sev-snp service cannot be verified by nodes: its attestation key is vouched for by the GCE API, which needs a Google credential a node does not have"
            ),
            other => bail!(
                "join-client verifies qemu-vtpm, aws-sev-snp, azure-sev-snp, qemu-tdx and azure-tdx services, not {other}"
            ),
        }
    }
    if !options.gcp_projects.is_empty() && variant != Variant::GcpSevSnp {
        bail!("--gcp-project is for gcp-sev-snp, not {variant}");
    }
    let snp = matches!(
        variant,
        Variant::AwsSevSnp | Variant::AzureSevSnp | Variant::GcpSevSnp
    );
    let tdx = matches!(variant, Variant::QemuTdx | Variant::AzureTdx);
    if options.pin_chip_id && !snp {
        bail!("--pin-chip-id is for the SEV-SNP variants, not {variant}");
    }
    if options.amd_root_key.is_some() && !snp {
        bail!("--amd-root-key is for the SEV-SNP variants, not {variant}");
    }
    if (options.intel_root_key.is_some() || !options.tcb_statuses.is_empty()) && !tdx {
        bail!("--intel-root-key and --accept-tcb-status are for the TDX variants, not {variant}");
    }
    Ok(())
}

/// The config one document shows.
fn derive_one(variant: Variant, document: &[u8], options: &DeriveOptions) -> anyhow::Result<One> {
    let mut notes = Vec::new();
    let mut config = Config::new();
    let mut snp = None;
    match variant {
        Variant::QemuVtpm => {
            let doc = vtpm_document(document)?;
            config.measurements = pcr_measurements(&doc, &mut notes)?;
            let digest = crate::ak_digest_of_document(document)?;
            config.set("trustedAkDigests", json!([digest]));
            notes.push(if options.service_policy {
                "trustedAkDigests lists the attestation keys of the documents given only: add every control-plane node's that may serve joins (one more --document each, or attest-tool ak-digest)".to_owned()
            } else {
                "trustedAkDigests lists the attestation keys of the documents given only: add every other node's (one more --document each, or attest-tool ak-digest)".to_owned()
            });
        }
        Variant::AwsSevSnp | Variant::AzureSevSnp | Variant::GcpSevSnp => {
            let doc = vtpm_document(document)?;
            config.measurements = pcr_measurements(&doc, &mut notes)?;
            let info = InstanceInfo::parse(
                doc.hardware_evidence("the document has no InstanceInfo (SNP evidence)")?,
            )
            .context("the document's InstanceInfo is not SNP evidence")?;
            let product = snp_fields(variant, &info, options, &mut config, &mut notes)?;
            snp = Some((info.report, product));
        }
        Variant::QemuTdx => {
            let (quote, _) = attestation::variants::tdx::parse_qemu_document(document)
                .context("not a qemu-tdx document")?;
            let td = quote.td();
            for (index, value) in td.measurements() {
                config.measurements.insert(index, (value, index == 4));
            }
            notes.push(
                "measurement 4 (RTMR3) is warnOnly: the running system extends it, so it differs between boots; set warnOnly to false if your nodes' RTMR3 is fixed at join time".to_owned(),
            );
            tdx_fields(variant, &quote, options, &mut config, &mut notes)?;
        }
        Variant::AzureTdx => {
            let doc = vtpm_document(document)?;
            config.measurements = pcr_measurements(&doc, &mut notes)?;
            let (quote, _) = parse_azure_instance_info(
                doc.hardware_evidence("the document has no InstanceInfo (TDX evidence)")?,
            )
            .context("the document's InstanceInfo is not azure-tdx evidence")?;
            config.set("mrtds", json!([hex::encode(quote.td().mr_td)]));
            tdx_fields(variant, &quote, options, &mut config, &mut notes)?;
        }
        other => bail!(
            "attest-tool derives qemu-vtpm, aws-sev-snp, azure-sev-snp, gcp-sev-snp, qemu-tdx and azure-tdx configs, not {other}"
        ),
    }
    Ok(One { config, notes, snp })
}

/// The fields that list what is accepted: the merged config accepts every document's.
const LISTS: [&str; 6] = [
    "trustedAkDigests",
    "launchMeasurements",
    "acceptedAuthorKeyDigests",
    "allowedChipIds",
    "mrtds",
    "mrSeams",
];

/// One config that admits every document's node: the measurements must be the same (nodes of
/// one image measure the same); lists (keys, launch measurements, ID and author keys, chips,
/// MRTDs, MRSEAMs) accept each document's; minimums (TCB per product, QE, PCE and TEE TCB SVNs)
/// are the lowest; SMT is allowed if any node has it; HOST_DATA and a list that not every
/// document has are left out, with a note; any other field must be the same.
fn merge(ones: &[(&str, &One)]) -> anyhow::Result<(Config, Vec<String>)> {
    let Some(&(first_name, first)) = ones.first() else {
        bail!("no document given");
    };
    let mut notes: Vec<String> = Vec::new();
    for (_, one) in ones {
        for note in &one.notes {
            if !notes.contains(note) {
                notes.push(note.clone());
            }
        }
    }
    let show = |m: Option<&(Vec<u8>, bool)>| m.map_or("absent".to_owned(), |(v, _)| hex::encode(v));
    for &(name, one) in &ones[1..] {
        let indices: std::collections::BTreeSet<&u32> = first
            .config
            .measurements
            .keys()
            .chain(one.config.measurements.keys())
            .collect();
        for index in indices {
            let (a, b) = (
                first.config.measurements.get(index),
                one.config.measurements.get(index),
            );
            if a != b {
                bail!(
                    "measurement {index} differs between {first_name} ({}) and {name} ({}): nodes of one image measure the same, so derive from one image's nodes (and set warnOnly by hand on a register that differs from node to node)",
                    show(a),
                    show(b)
                );
            }
        }
    }
    let mut merged = Config::new();
    merged.measurements = first.config.measurements.clone();
    let tcb = merged_tcb(ones);
    let mut keys: Vec<&String> = Vec::new();
    for (_, one) in ones {
        for key in one.config.fields.keys() {
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    for key in keys {
        let values: Vec<Option<&Value>> =
            ones.iter().map(|(_, o)| o.config.fields.get(key)).collect();
        if let Some(value) = tcb.as_ref().and_then(|t| t.get(key)) {
            merged.set(key, value.clone());
            continue;
        }
        let all: Option<Vec<&Value>> = values.iter().copied().collect();
        let Some(all) = all else {
            notes.push(format!(
                "{key} is left out: not every document has it (a launch without an author key, or without an ID block)"
            ));
            continue;
        };
        let value = match key.as_str() {
            k if LISTS.contains(&k) => union(all.iter().map(|v| v.as_array()))?,
            "firmwareSignerConfig" => json!({
                "acceptedKeyDigests": union(all.iter().map(|v| v["acceptedKeyDigests"].as_array()))?,
                "enforcementPolicy": "Equal",
            }),
            "smtAllowed" => json!(all.iter().any(|v| v.as_bool() == Some(true))),
            "qeSVN" | "pceSVN" => json!(all.iter().filter_map(|v| v.as_u64()).min()),
            "teeTCBSVN" => {
                let svns: Vec<Vec<u8>> = all
                    .iter()
                    .map(|v| hex::decode(v.as_str().unwrap_or_default()))
                    .collect::<Result<_, _>>()?;
                let lowest: Vec<u8> = (0..svns[0].len())
                    .map(|i| {
                        svns.iter()
                            .filter_map(|s| s.get(i))
                            .copied()
                            .min()
                            .unwrap_or(0)
                    })
                    .collect();
                json!(hex::encode(lowest))
            }
            _ => {
                if let Some((i, _)) = all.iter().enumerate().find(|(_, v)| **v != all[0]) {
                    if key == "hostData" {
                        notes.push(
                            "hostData is left out: the documents' HOST_DATA differ".to_owned(),
                        );
                        continue;
                    }
                    bail!(
                        "{key} differs between {first_name} ({}) and {} ({}): one config cannot admit both",
                        all[0],
                        ones[i].0,
                        all[i]
                    );
                }
                all[0].clone()
            }
        };
        merged.set(key, value);
    }
    if let Some(minimum) = tcb.as_ref().and_then(|t| t.get("minimumTcb")) {
        if !merged.fields.contains_key("minimumTcb") {
            merged.set("minimumTcb", minimum.clone());
        }
    }
    Ok((merged, notes))
}

/// The entries of several JSON lists, each once, in order of appearance.
fn union<'a>(lists: impl Iterator<Item = Option<&'a Vec<Value>>>) -> anyhow::Result<Value> {
    let mut out: Vec<Value> = Vec::new();
    for list in lists {
        for value in list.context("a list field is not a list")? {
            if !out.contains(value) {
                out.push(value.clone());
            }
        }
    }
    Ok(Value::Array(out))
}

/// SEV-SNP: the minimum TCB fields over all reports: each product's lowest, Milan's at the top
/// level (or, without a Milan report, the lowest of all), the others' under `minimumTcb`.
fn merged_tcb(ones: &[(&str, &One)]) -> Option<serde_json::Map<String, Value>> {
    let reports: Vec<(Product, Tcb)> = ones
        .iter()
        .filter_map(|(_, one)| one.snp.as_ref())
        .map(|(report, product)| {
            let tcb = lowest([
                report.reported_tcb(*product),
                report.committed_tcb(*product),
                report.launch_tcb(*product),
            ]);
            (*product, tcb)
        })
        .collect();
    if reports.is_empty() {
        return None;
    }
    let lowest_of = |tcbs: Vec<Tcb>| -> Option<Tcb> {
        tcbs.into_iter().reduce(|a, b| Tcb {
            fmc: a.fmc.min(b.fmc).or(a.fmc).or(b.fmc),
            bootloader: a.bootloader.min(b.bootloader),
            tee: a.tee.min(b.tee),
            snp: a.snp.min(b.snp),
            microcode: a.microcode.min(b.microcode),
        })
    };
    let of = |product: Product| {
        lowest_of(
            reports
                .iter()
                .filter(|(p, _)| *p == product)
                .map(|(_, t)| *t)
                .collect(),
        )
    };
    let top =
        of(Product::Milan).or_else(|| lowest_of(reports.iter().map(|(_, t)| *t).collect()))?;
    let mut fields = tcb_json(&top, false).as_object()?.clone();
    let mut others = serde_json::Map::new();
    for product in [Product::Genoa, Product::Turin] {
        if let Some(tcb) = of(product) {
            others.insert(
                product.name().to_owned(),
                tcb_json(&tcb, product == Product::Turin),
            );
        }
    }
    if !others.is_empty() {
        fields.insert("minimumTcb".to_owned(), Value::Object(others));
    }
    Some(fields)
}

/// The variant a bare document's shape names, where only one variant has that shape: a
/// `{"RawQuote"}` document is qemu-tdx; a vTPM document's hardware evidence names the SNP
/// variant (`Azure` or `GCP` set, else aws-sev-snp) or azure-tdx (`RuntimeData` beside the
/// quote). A vTPM document without hardware evidence could be any TPM variant: `None`.
pub fn infer_variant(document: &[u8]) -> Option<Variant> {
    let value: Value = serde_json::from_slice(document).ok()?;
    let object = value.as_object()?;
    if object.contains_key("RawQuote") {
        return Some(Variant::QemuTdx);
    }
    let doc = AttestationDocument::parse(document).ok()?;
    let info: Value = serde_json::from_slice(doc.instance_info.as_deref()?).ok()?;
    let info = info.as_object()?;
    let set = |key: &str| info.get(key).is_some_and(|v| !v.is_null());
    if !set("AttestationReport") {
        return None;
    }
    Some(if set("RuntimeData") && !set("ReportSigner") {
        Variant::AzureTdx
    } else if set("Azure") {
        Variant::AzureSevSnp
    } else if set("GCP") {
        Variant::GcpSevSnp
    } else {
        Variant::AwsSevSnp
    })
}

/// Loads `json` as attest-proxy does for `variant`, returning the policy digest.
fn load(variant: Variant, json: &[u8]) -> anyhow::Result<String> {
    Ok(match variant {
        Variant::QemuVtpm => QemuVtpmConfig::from_attestation_config(json)?.digest(),
        Variant::AwsSevSnp | Variant::AzureSevSnp | Variant::GcpSevSnp => {
            let binding = match variant {
                Variant::AwsSevSnp => Binding::Aws,
                Variant::AzureSevSnp => Binding::Azure,
                _ => Binding::Gcp,
            };
            let none = Arc::new(attestation::snp::StaticCollateral::new());
            SevSnpValidator::from_attestation_config(binding, json, none)?.1
        }
        _ => {
            let kind = if variant == Variant::QemuTdx {
                TdxKind::Qemu
            } else {
                TdxKind::Azure
            };
            let none = Arc::new(attestation::tdx::StaticCollateral::new());
            TdxValidator::from_attestation_config(kind, json, none)?.1
        }
    })
}

fn vtpm_document(document: &[u8]) -> anyhow::Result<AttestationDocument> {
    AttestationDocument::parse(document).context("not a vTPM attestation document (JSON)")
}

/// The PCRs of the document's quote of the strongest bank the service compares, all enforced.
fn pcr_measurements(
    doc: &AttestationDocument,
    notes: &mut Vec<String>,
) -> anyhow::Result<BTreeMap<u32, (Vec<u8>, bool)>> {
    let quotes = doc
        .attestation
        .as_ref()
        .map(|a| a.quotes.as_slice())
        .unwrap_or_default();
    let banks: Vec<(HashAlg, &BTreeMap<u32, Vec<u8>>)> = quotes
        .iter()
        .filter_map(|q| q.pcrs.as_ref())
        .filter_map(|p| {
            let alg = u16::try_from(p.hash).ok().and_then(HashAlg::from_id)?;
            Some((alg, &p.pcrs))
        })
        .collect();
    let (bank, pcrs) = [HashAlg::Sha256, HashAlg::Sha384, HashAlg::Sha512]
        .into_iter()
        .find_map(|wanted| banks.iter().find(|(alg, _)| *alg == wanted).copied())
        .context(
            "the document has no quote of a SHA-256, SHA-384 or SHA-512 PCR bank (the service compares no other)",
        )?;
    if pcrs.is_empty() {
        bail!("the document's {bank} quote lists no PCR values");
    }
    for (index, value) in pcrs {
        if value.len() != bank.digest_len() {
            bail!(
                "the document's {bank} PCR {index} is {} bytes, not {}",
                value.len(),
                bank.digest_len()
            );
        }
    }
    notes.push(format!(
        "measurements: all {} PCRs of the document's {bank} quote, enforced; set warnOnly on any that differ between your nodes (Constellation's PCR 15, for one, differs once a node has joined)",
        pcrs.len()
    ));
    Ok(pcrs
        .iter()
        .map(|(&index, value)| (index, (value.clone(), false)))
        .collect())
}

/// The lowest of each SVN over the TCBs the service compares with the minimum.
fn lowest(tcbs: [Tcb; 3]) -> Tcb {
    let min = |f: fn(&Tcb) -> u8| tcbs.iter().map(f).min().unwrap_or(0);
    Tcb {
        fmc: tcbs.iter().filter_map(|t| t.fmc).min(),
        bootloader: min(|t| t.bootloader),
        tee: min(|t| t.tee),
        snp: min(|t| t.snp),
        microcode: min(|t| t.microcode),
    }
}

fn tcb_json(tcb: &Tcb, fmc: bool) -> Value {
    let mut value = json!({
        "bootloaderVersion": tcb.bootloader,
        "teeVersion": tcb.tee,
        "snpVersion": tcb.snp,
        "microcodeVersion": tcb.microcode,
    });
    if fmc {
        value["fmcVersion"] = json!(tcb.fmc.unwrap_or(0));
    }
    value
}

fn snp_fields(
    variant: Variant,
    info: &InstanceInfo,
    options: &DeriveOptions,
    config: &mut Config,
    notes: &mut Vec<String>,
) -> anyhow::Result<Product> {
    let report: &Report = &info.report;
    let policy = report.policy();
    if policy & policy_bits::DEBUG != 0 {
        bail!(
            "the report's guest policy allows debugging (DEBUG), which the service refuses whatever the config says: no policy admits this node"
        );
    }
    if policy & policy_bits::MIGRATE_MA != 0 {
        bail!(
            "the report's guest policy allows a migration agent (MIGRATE_MA), which the service refuses whatever the config says: no policy admits this node"
        );
    }
    if report.vmpl() != 0 {
        bail!(
            "the report was made at VMPL {}, and the service accepts VMPL 0 only: no policy admits this node",
            report.vmpl()
        );
    }
    let product = attestation::variants::sev_snp::product_of(info)
        .context("the report's product (Milan, Genoa or Turin)")?;
    let minimum = lowest([
        report.reported_tcb(product),
        report.committed_tcb(product),
        report.launch_tcb(product),
    ]);
    // Constellation's four top-level fields are Milan's minimum (and Constellation applies them
    // to every product); the other products have their own under minimumTcb.
    let top = tcb_json(&minimum, false);
    if let Some(fields) = top.as_object() {
        for (key, value) in fields {
            config.set(key, value.clone());
        }
    }
    match product {
        Product::Milan => {}
        Product::Genoa | Product::Turin => {
            config.set(
                "minimumTcb",
                json!({ product.name(): tcb_json(&minimum, product == Product::Turin) }),
            );
            notes.push(format!(
                "a report is from a {product} CPU: its minimum TCB is minimumTcb.{product}; without a Milan document the top-level bootloaderVersion, teeVersion, snpVersion and microcodeVersion (Milan's minimum here, every product's in Constellation's CLI) repeat the lowest numbers of the others. If your fleet has Milan machines, give a Milan node's document too"
            ));
        }
    }
    notes.push(
        "the minimum TCB of each product is the lowest of the reported, committed and launch TCBs of its reports; nodes on older firmware are refused, so raise it as AMD publishes fixes".to_owned(),
    );
    config.set("smtAllowed", json!(policy & policy_bits::SMT != 0));
    config.set(
        "launchMeasurements",
        json!([hex::encode(report.measurement())]),
    );
    config.set("hostData", json!(hex::encode(report.host_data())));
    notes.push(
        "launchMeasurements and hostData are those of the documents' launches: add the MEASUREMENT of each firmware you roll out, and leave hostData out if your hosts give each VM its own".to_owned(),
    );
    let zero48 = [0u8; 48];
    if report.author_key_digest() != &zero48 {
        config.set(
            "acceptedAuthorKeyDigests",
            json!([hex::encode(report.author_key_digest())]),
        );
    }
    if report.id_key_digest() != &zero48 {
        config.set(
            "firmwareSignerConfig",
            json!({
                "acceptedKeyDigests": [hex::encode(report.id_key_digest())],
                "enforcementPolicy": "Equal",
            }),
        );
        notes.push(
            "firmwareSignerConfig accepts the reports' ID key digests only, enforced (Equal); add the digests of the firmware signers you roll out next".to_owned(),
        );
    } else {
        notes.push(
            "a launch without an ID block (ID key digest zero) is pinned by launchMeasurements alone".to_owned(),
        );
    }
    if options.pin_chip_id {
        if report.chip_id_masked() {
            bail!(
                "--pin-chip-id: the report masks its CHIP_ID (as AWS's do), so no chip can be pinned"
            );
        }
        config.set("allowedChipIds", json!([hex::encode(report.chip_id())]));
        notes.push(
            "allowedChipIds admits the documents' machines only: give every machine's document, or leave the field out to admit any".to_owned(),
        );
    }
    match &options.amd_root_key {
        Some(pem) => config.set("amdRootKey", json!(pem)),
        None => notes.push(
            "amdRootKey is left out: AMD's built-in roots (Milan, Genoa, Turin) are trusted"
                .to_owned(),
        ),
    }
    if variant == Variant::GcpSevSnp {
        let project = info.gce.as_ref().map(|g| g.project_id.as_str());
        if options.gcp_projects.is_empty() {
            notes.push(format!(
                "allowedGcpProjects is left out, so an instance of any GCP project is admitted; pass --gcp-project for each of your cluster's projects{}",
                project
                    .filter(|p| !p.is_empty())
                    .map(|p| format!(" (this instance is in {p:?})"))
                    .unwrap_or_default()
            ));
        } else {
            config.set("allowedGcpProjects", json!(options.gcp_projects));
            if let Some(project) = project {
                if !options.gcp_projects.iter().any(|p| p == project) {
                    notes.push(format!(
                        "this document's instance is in project {project:?}, which --gcp-project does not name: the policy refuses it"
                    ));
                }
            }
        }
    }
    Ok(product)
}

fn tdx_fields(
    variant: Variant,
    quote: &TdQuote,
    options: &DeriveOptions,
    config: &mut Config,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    let td = quote.td();
    if td.is_debug() {
        bail!(
            "the TD is a debug TD, which the service refuses whatever the config says: no policy admits this node"
        );
    }
    if variant == Variant::QemuTdx && !quote.sept_ve_disable() {
        bail!(
            "the TD does not set SEPT_VE_DISABLE, which qemu-tdx requires (stricter than Constellation): no policy admits this node"
        );
    }
    config.set("mrSeams", json!([hex::encode(td.mr_seam)]));
    config.set("xfam", json!(hex::encode(td.xfam)));
    config.set("qeVendorID", json!(hex::encode(quote.qe_vendor_id())));
    config.set("qeSVN", json!(quote.qe_svn()));
    config.set("pceSVN", json!(quote.pce_svn()));
    config.set("teeTCBSVN", json!(hex::encode(td.tee_tcb_svn)));
    let statuses = if options.tcb_statuses.is_empty() {
        vec!["UpToDate".to_owned()]
    } else {
        options.tcb_statuses.clone()
    };
    for status in &statuses {
        if attestation::tdx::config::parse_status(status).is_none() {
            bail!("--accept-tcb-status {status:?} is not a TCB status Intel's collateral uses");
        }
    }
    notes.push(format!(
        "acceptedTcbStatuses is {statuses:?}: the status comes from Intel's collateral when a node joins, not from the document (attest-tool tdx verify shows the quote's)"
    ));
    config.set("acceptedTcbStatuses", json!(statuses));
    notes.push(
        "mrSeams admits this TDX module only: add the MRSEAM of a module update before hosts roll it out".to_owned(),
    );
    notes.push(
        "qeSVN, pceSVN and teeTCBSVN are the quote's own, as minimums; nodes on older TDX firmware are refused".to_owned(),
    );
    match &options.intel_root_key {
        Some(pem) => config.set("intelRootKey", json!(pem)),
        None => {
            notes.push("intelRootKey is left out: Intel's built-in SGX root is trusted".to_owned())
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use base64::Engine as _;

    use super::*;

    fn vtpm_with(info: Option<Value>) -> Vec<u8> {
        let info = info
            .map(|i| base64::engine::general_purpose::STANDARD.encode(i.to_string().as_bytes()));
        json!({"Attestation": {"ak_pub": "AAE="}, "InstanceInfo": info, "UserData": null})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn a_bare_documents_variant_is_inferred_only_where_its_shape_is_one_variants() {
        let report = json!("AAAA");
        assert_eq!(
            infer_variant(br#"{"RawQuote":"AAAA","UserData":""}"#),
            Some(Variant::QemuTdx)
        );
        for (info, variant) in [
            (
                json!({"AttestationReport": report, "RuntimeData": "AAAA"}),
                Some(Variant::AzureTdx),
            ),
            (
                json!({"ReportSigner": "", "CertChain": "", "AttestationReport": report,
                       "Azure": {"RuntimeData": "AAAA", "MAAToken": ""}, "GCP": null}),
                Some(Variant::AzureSevSnp),
            ),
            (
                json!({"ReportSigner": "", "CertChain": "", "AttestationReport": report,
                       "Azure": null, "GCP": {"project_id": "p"}}),
                Some(Variant::GcpSevSnp),
            ),
            (
                json!({"ReportSigner": "", "CertChain": "", "AttestationReport": report,
                       "Azure": null, "GCP": null}),
                Some(Variant::AwsSevSnp),
            ),
            (json!({"something": "else"}), None),
        ] {
            assert_eq!(
                infer_variant(&vtpm_with(Some(info.clone()))),
                variant,
                "{info}"
            );
        }
        // Any TPM variant's document without hardware evidence looks like this.
        assert_eq!(infer_variant(&vtpm_with(None)), None);
        assert_eq!(infer_variant(b"not json"), None);
    }
}
