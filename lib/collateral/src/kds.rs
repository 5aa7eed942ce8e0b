//! AMD's key distribution service (KDS) as a [`Source`], and the SEV-SNP collateral the verifier
//! asks for, answered from the [`Cache`].
//!
//! Keys and the KDS paths they name (the real service is `https://kdsintf.amd.com`; an operator
//! may put a caching proxy in front of it):
//!
//! | key | path | refreshed |
//! |---|---|---|
//! | `crl/vcek/{product}` | `/vcek/v1/{product}/crl` (DER; revokes ASKs, the ASK's CRL distribution point) | a quarter of its window before `nextUpdate`; stale after it |
//! | `crl/vlek/{product}` | `/vlek/v1/{product}/crl` (DER; revokes ASVKs, the ASVK's CRL distribution point) | as above |
//! | `chain/vcek/{product}` | `/vcek/v1/{product}/cert_chain` (PEM: ASK, ARK) | weekly |
//! | `chain/vlek/{product}` | `/vlek/v1/{product}/cert_chain` (PEM: ASVK, ARK) | weekly |
//! | `vcek/{product}/{hwid}/{tcb}` | `/vcek/v1/{product}/{hwid}?blSPL=..&teeSPL=..&snpSPL=..&ucodeSPL=..` (DER) | never needed: a VCEK names one chip at one TCB |
//!
//! CRLs and chains are shared keys ([`crate::KeyClass::Shared`]); a VCEK key is named by the
//! chip ID and TCB a node's report claims ([`crate::KeyClass::NodeNamed`]): a node that leaves
//! its VCEK out of its document can make the cache fetch one for any chip it invents, so
//! attest-proxy bounds these keys apart from the CRLs and chains.
//!
//! The source checks only that what it fetched parses (a CRL's dates decide its refresh); the
//! verifier checks every signature, as it does for what a node sends.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::http::HttpClient;
use crate::{Cache, FetchError, FetchFuture, Fetched, KeyClass, Source};
use attestation::snp::{
    Cert, CollateralError, Crl, Product, SigningKey, SnpCollateral, Tcb, certs_from_pem,
};

/// AMD's KDS.
pub const AMD_KDS: &str = "https://kdsintf.amd.com";

/// The largest answer read: a CRL or chain is a few kilobytes.
const MAX_BODY: usize = 256 * 1024;

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);
const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// Fetches from a KDS over HTTPS (or plain HTTP, for an operator's proxy: everything served is
/// signed by AMD and checked as such).
#[derive(Clone)]
pub struct KdsSource {
    base: String,
    client: HttpClient,
}

impl std::fmt::Debug for KdsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KdsSource")
            .field("base", &self.base)
            .field("timeout", &self.client.timeout())
            .finish_non_exhaustive()
    }
}

/// Why a KDS client could not be built.
pub type KdsSetupError = crate::http::SetupError;

impl KdsSource {
    /// A client for the KDS at `base` (e.g. [`AMD_KDS`]), trusting the system's roots plus the
    /// PEM certificates in `extra_ca` (an operator's proxy, a test's stand-in).
    pub fn new(
        base: &str,
        extra_ca: Option<&std::path::Path>,
        timeout: Duration,
    ) -> Result<KdsSource, KdsSetupError> {
        Ok(KdsSource {
            base: crate::http::base_url(base)?,
            client: HttpClient::new(extra_ca, timeout, MAX_BODY)?,
        })
    }

    /// The URL a key names.
    pub fn url(&self, key: &str) -> Option<String> {
        let parts: Vec<&str> = key.split('/').collect();
        match parts.as_slice() {
            ["crl", kind @ ("vcek" | "vlek"), product] => {
                Some(format!("{}/{kind}/v1/{product}/crl", self.base))
            }
            ["chain", kind @ ("vcek" | "vlek"), product] => {
                Some(format!("{}/{kind}/v1/{product}/cert_chain", self.base))
            }
            ["vcek", product, hw_id, bl, tee, snp, ucode, rest @ ..] => {
                let fmc = match rest {
                    [fmc] => format!("fmcSPL={fmc}&"),
                    _ => String::new(),
                };
                Some(format!(
                    "{}/vcek/v1/{product}/{hw_id}?{fmc}blSPL={bl}&teeSPL={tee}&snpSPL={snp}&ucodeSPL={ucode}",
                    self.base
                ))
            }
            _ => None,
        }
    }

    async fn get(&self, url: String) -> Result<Vec<u8>, FetchError> {
        match self.client.get(&url).await? {
            Ok(answer) => Ok(answer.body),
            Err(refused) => Err(FetchError::new(format!("{url}: HTTP {}", refused.status))),
        }
    }
}

/// When a fetched item is to be refreshed and when it goes stale.
fn lifetime(key: &str, bytes: &[u8]) -> Result<(SystemTime, SystemTime), String> {
    let now = SystemTime::now();
    if key.starts_with("crl/") {
        let crl = Crl::from_der(bytes.to_vec()).map_err(|e| e.to_string())?;
        let at = |secs: i64| {
            SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0))
        };
        let (this, next) = (crl.this_update(), crl.next_update());
        let quarter = (next - this).max(0) / 4;
        return Ok((at(next - quarter), at(next)));
    }
    if key.starts_with("chain/") {
        let certs = certs_from_pem(bytes).map_err(|e| e.to_string())?;
        if certs.len() != 2 {
            return Err(format!(
                "{} certificates, expected the intermediate and the ARK",
                certs.len()
            ));
        }
        return Ok((now + WEEK, now + 4 * WEEK));
    }
    Cert::from_der(bytes.to_vec()).map_err(|e| e.to_string())?;
    Ok((now + YEAR, now + YEAR))
}

impl Source for KdsSource {
    fn fetch(&self, key: &str) -> FetchFuture {
        let source = self.clone();
        let key = key.to_owned();
        Box::pin(async move {
            let url = source
                .url(&key)
                .ok_or_else(|| FetchError::new(format!("{key} names nothing on a KDS")))?;
            let bytes = source.get(url.clone()).await?;
            let (refresh_after, stale_after) =
                lifetime(&key, &bytes).map_err(|e| FetchError::new(format!("{url}: {e}")))?;
            Ok(Fetched {
                bytes,
                refresh_after,
                stale_after,
            })
        })
    }

    /// CRLs and chains are named by the service, per product; a VCEK by the chip ID and TCB the
    /// node's report claims, which cannot be checked before the VCEK is had.
    fn class(&self, key: &str) -> KeyClass {
        if key.starts_with("crl/") || key.starts_with("chain/") {
            KeyClass::Shared
        } else {
            KeyClass::NodeNamed
        }
    }
}

/// The SNP verifier's collateral, from a cache in front of a KDS.
#[derive(Clone, Debug)]
pub struct KdsCollateral {
    cache: Cache,
    max_stale: Duration,
}

impl KdsCollateral {
    /// `max_stale` must be the cache's: a CRL is accepted that long past its `nextUpdate`.
    pub fn new(cache: Cache, max_stale: Duration) -> Self {
        KdsCollateral { cache, max_stale }
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Starts fetching the CRLs and chains of `products`, so the first joins find them cached.
    pub fn warm(&self, products: &[Product]) {
        for product in products {
            for key in [SigningKey::Vcek, SigningKey::Vlek] {
                self.cache.prefetch(&crl_key(*product, key));
                self.cache.prefetch(&chain_key(*product, key));
            }
        }
    }

    fn get(&self, key: &str) -> Result<Arc<Vec<u8>>, CollateralError> {
        self.cache
            .get(key)
            .map_err(|e| CollateralError(e.to_string()))
    }
}

/// The path segment KDS names a signing-key kind by.
fn kind(key: SigningKey) -> &'static str {
    match key {
        SigningKey::Vcek => "vcek",
        SigningKey::Vlek => "vlek",
    }
}

/// The key of AMD's CRL for `product`'s `key` chain.
pub fn crl_key(product: Product, key: SigningKey) -> String {
    format!("crl/{}/{product}", kind(key))
}

/// The key of the certificate chain (ASK or ASVK, with the ARK) of `product`'s `key`s.
pub fn chain_key(product: Product, key: SigningKey) -> String {
    format!("chain/{}/{product}", kind(key))
}

/// The intermediate (ASK or ASVK) in a chain the KDS served as [`chain_key`]; its ARK is not
/// used (the trusted one comes from the config).
pub fn intermediate_of(
    chain_pem: &[u8],
    product: Product,
    key: SigningKey,
) -> Result<Cert, CollateralError> {
    certs_from_pem(chain_pem)
        .map_err(|e| CollateralError(e.to_string()))?
        .into_iter()
        .find(|c| !c.common_name().starts_with("ARK-"))
        .ok_or_else(|| {
            CollateralError(format!(
                "the {product} {} chain has no intermediate",
                kind(key)
            ))
        })
}

/// The key of a VCEK.
pub fn vcek_key(product: Product, hw_id: &[u8], tcb: &Tcb) -> String {
    let mut key = format!(
        "vcek/{product}/{}/{:02}/{:02}/{:02}/{:02}",
        hex::encode(hw_id),
        tcb.bootloader,
        tcb.tee,
        tcb.snp,
        tcb.microcode
    );
    if product == Product::Turin {
        key.push_str(&format!("/{:02}", tcb.fmc.unwrap_or(0)));
    }
    key
}

impl SnpCollateral for KdsCollateral {
    fn crl(&self, product: Product, key: SigningKey) -> Result<Crl, CollateralError> {
        let bytes = self.get(&crl_key(product, key))?;
        Crl::from_der(bytes.to_vec()).map_err(|e| CollateralError(e.to_string()))
    }

    fn vcek(&self, product: Product, hw_id: &[u8], tcb: &Tcb) -> Result<Cert, CollateralError> {
        let bytes = self.get(&vcek_key(product, hw_id, tcb))?;
        Cert::from_der(bytes.to_vec()).map_err(|e| CollateralError(e.to_string()))
    }

    fn intermediate(&self, product: Product, key: SigningKey) -> Result<Cert, CollateralError> {
        let bytes = self.get(&chain_key(product, key))?;
        intermediate_of(&bytes, product, key)
    }

    fn crl_max_stale(&self) -> i64 {
        i64::try_from(self.max_stale.as_secs()).unwrap_or(i64::MAX)
    }
}
