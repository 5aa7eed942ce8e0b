//! Where a verifier gets what a document lacks: a VCEK (nodes may omit it), the ASK or ASVK, and
//! AMD's CRL for a product and signing-key kind (AMD publishes two per product, both signed by
//! the ARK: KDS `/vcek/v1/{product}/crl`, which the ASK's CRL distribution point names, and
//! `/vlek/v1/{product}/crl`, which the ASVK's names). The service's source is a cache in front of AMD's KDS; tests and
//! offline tools use [`StaticCollateral`].

use std::collections::HashMap;
use std::fmt;

use super::{Cert, Crl, Product, SigningKey, Tcb};

/// Collateral that cannot be had now (the source failed or has nothing yet). The node should
/// retry: its evidence was not found wanting.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct CollateralError(pub String);

/// A source of AMD collateral. Implementations must not block for long: the verifier calls them
/// on its verification threads, so a slow source is answered from cache or refused.
pub trait SnpCollateral: Send + Sync + fmt::Debug {
    /// AMD's current CRL for `product`'s `key` chain: the one revoking ASKs (and VCEKs) for a
    /// VCEK, the one revoking ASVKs (and VLEKs) for a VLEK.
    fn crl(&self, product: Product, key: SigningKey) -> Result<Crl, CollateralError>;

    /// The VCEK of the chip `hw_id` at `tcb`.
    fn vcek(&self, product: Product, hw_id: &[u8], tcb: &Tcb) -> Result<Cert, CollateralError>;

    /// The ASK (for VCEKs) or ASVK (for VLEKs) of `product`.
    fn intermediate(&self, product: Product, key: SigningKey) -> Result<Cert, CollateralError>;

    /// How long past its `nextUpdate` a CRL from this source is still accepted (seconds): the
    /// bounded staleness a cache allows while AMD is unreachable. Zero: never.
    fn crl_max_stale(&self) -> i64 {
        0
    }
}

/// Collateral held in memory: given up front, never fetched.
#[derive(Clone, Debug, Default)]
pub struct StaticCollateral {
    crls: HashMap<(Product, bool), Crl>,
    vceks: Vec<(Product, Vec<u8>, Tcb, Cert)>,
    intermediates: HashMap<(Product, bool), Cert>,
}

impl StaticCollateral {
    pub fn new() -> Self {
        Self::default()
    }

    /// `crl` as both of `product`'s CRLs (the VCEK and the VLEK chain's): for tests whose
    /// simulated AMD revokes nothing, or the same serials on both.
    pub fn with_crl(self, product: Product, crl: Crl) -> Self {
        self.with_crl_for(product, SigningKey::Vcek, crl.clone())
            .with_crl_for(product, SigningKey::Vlek, crl)
    }

    /// `crl` as `product`'s CRL for the `key` chain.
    pub fn with_crl_for(mut self, product: Product, key: SigningKey, crl: Crl) -> Self {
        self.crls.insert((product, key == SigningKey::Vlek), crl);
        self
    }

    pub fn with_vcek(mut self, product: Product, hw_id: &[u8], tcb: Tcb, vcek: Cert) -> Self {
        self.vceks.push((product, hw_id.to_vec(), tcb, vcek));
        self
    }

    pub fn with_intermediate(mut self, product: Product, key: SigningKey, cert: Cert) -> Self {
        self.intermediates
            .insert((product, key == SigningKey::Vlek), cert);
        self
    }
}

impl SnpCollateral for StaticCollateral {
    fn crl(&self, product: Product, key: SigningKey) -> Result<Crl, CollateralError> {
        self.crls
            .get(&(product, key == SigningKey::Vlek))
            .cloned()
            .ok_or_else(|| CollateralError(format!("no {product} CRL for {key} chains")))
    }

    fn vcek(&self, product: Product, hw_id: &[u8], tcb: &Tcb) -> Result<Cert, CollateralError> {
        self.vceks
            .iter()
            .find(|(p, h, t, _)| *p == product && h == hw_id && t == tcb)
            .map(|(_, _, _, cert)| cert.clone())
            .ok_or_else(|| CollateralError(format!("no VCEK for this {product} chip at {tcb}")))
    }

    fn intermediate(&self, product: Product, key: SigningKey) -> Result<Cert, CollateralError> {
        self.intermediates
            .get(&(product, key == SigningKey::Vlek))
            .cloned()
            .ok_or_else(|| CollateralError(format!("no {product} intermediate for a {key}")))
    }
}
