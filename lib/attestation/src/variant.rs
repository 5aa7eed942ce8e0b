//! Attestation variants and the X.509 extension OIDs that name them in aTLS certificates.

use std::fmt;
use std::str::FromStr;

/// An attestation variant: which kind of evidence a node presents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Constellation's test-only dummy variant. Recognised so it can be refused by name.
    Dummy,
    AwsNitroTpm,
    AwsSevSnp,
    GcpSevEs,
    GcpSevSnp,
    AzureSevSnp,
    AzureTrustedLaunch,
    AzureTdx,
    QemuVtpm,
    QemuTdx,
}

impl Variant {
    /// Every variant, in Constellation's OID order.
    pub const ALL: [Variant; 10] = [
        Variant::Dummy,
        Variant::AwsNitroTpm,
        Variant::AwsSevSnp,
        Variant::GcpSevEs,
        Variant::GcpSevSnp,
        Variant::AzureSevSnp,
        Variant::AzureTrustedLaunch,
        Variant::AzureTdx,
        Variant::QemuVtpm,
        Variant::QemuTdx,
    ];

    /// Constellation's name for the variant, as used in its attestation config.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Dummy => "dummy",
            Variant::AwsNitroTpm => "aws-nitro-tpm",
            Variant::AwsSevSnp => "aws-sev-snp",
            Variant::GcpSevEs => "gcp-sev-es",
            Variant::GcpSevSnp => "gcp-sev-snp",
            Variant::AzureSevSnp => "azure-sev-snp",
            Variant::AzureTrustedLaunch => "azure-trustedlaunch",
            Variant::AzureTdx => "azure-tdx",
            Variant::QemuVtpm => "qemu-vtpm",
            Variant::QemuTdx => "qemu-tdx",
        }
    }

    /// The OID arcs of the certificate extension carrying this variant's attestation document.
    pub fn oid(self) -> &'static [u64] {
        match self {
            Variant::Dummy => &[1, 3, 9900, 1, 1],
            Variant::AwsNitroTpm => &[1, 3, 9900, 2, 1],
            Variant::AwsSevSnp => &[1, 3, 9900, 2, 2],
            Variant::GcpSevEs => &[1, 3, 9900, 3, 1],
            Variant::GcpSevSnp => &[1, 3, 9900, 3, 2],
            Variant::AzureSevSnp => &[1, 3, 9900, 4, 1],
            Variant::AzureTrustedLaunch => &[1, 3, 9900, 4, 2],
            Variant::AzureTdx => &[1, 3, 9900, 4, 3],
            Variant::QemuVtpm => &[1, 3, 9900, 5, 1],
            Variant::QemuTdx => &[1, 3, 9900, 5, 99],
        }
    }

    /// The OID in dotted form, e.g. `1.3.9900.5.1`.
    pub fn oid_string(self) -> String {
        self.oid()
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(".")
    }

    /// The variant whose extension has this dotted OID.
    pub fn from_oid_string(oid: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.oid_string() == oid)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown variant name.
#[derive(Debug, thiserror::Error)]
#[error("unknown attestation variant {0:?}")]
pub struct UnknownVariant(pub String);

impl FromStr for Variant {
    type Err = UnknownVariant;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| UnknownVariant(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_oids_round_trip() {
        for v in Variant::ALL {
            assert_eq!(v.name().parse::<Variant>().unwrap(), v);
            assert_eq!(Variant::from_oid_string(&v.oid_string()), Some(v));
        }
        assert_eq!(Variant::QemuVtpm.oid_string(), "1.3.9900.5.1");
        assert_eq!(Variant::QemuTdx.oid_string(), "1.3.9900.5.99");
        assert!("qemu-vtpm2".parse::<Variant>().is_err());
    }
}
