//! What the Azure issuers' tests check alike of the documents they issue.

#![allow(clippy::unwrap_used)]

use attestation::{Issuer, Validator};

/// `issuer`'s documents, for two nonces, pass `accepting` with their user data, its first note
/// naming `note`, and each only with its own nonce.
pub fn assert_accepted(issuer: &dyn Issuer, accepting: &dyn Validator, note: &str) {
    for nonce in [[1u8; 32], [2u8; 32]] {
        let document = issuer.issue(b"user data", &nonce).unwrap();
        let verified = accepting
            .validate(&document, &nonce)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(verified.user_data, b"user data");
        assert!(verified.notes[0].contains(note), "{:?}", verified.notes);
        // Bound to its nonce.
        assert!(accepting.validate(&document, &[9u8; 32]).is_err());
    }
}

/// A document `issuer` makes now is refused by `validator`, which says `expected`.
pub fn assert_refused(issuer: &dyn Issuer, validator: &dyn Validator, expected: &str) {
    let document = issuer.issue(b"user data", &[1; 32]).unwrap();
    let err = validator
        .validate(&document, &[1; 32])
        .unwrap_err()
        .to_string();
    assert!(err.contains(expected), "{err}");
}
