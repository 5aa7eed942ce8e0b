//! aws-nitro-tpm end to end within the library: documents as a node makes them (a software AK
//! standing in for the NitroTPM's, the identity document as InstanceInfo), each refusal by name.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::variants::aws_nitro_tpm::{AwsNitroTpmValidator, ImageRef, StaticEc2Images};
use attestation::{AkTrust, Error, Policy, Validator, ak_digest};
use soft_issuer::SoftIssuer;

const IMAGE: &str = "ami-0a1b2c3d4e5f60718";

fn identity(image: &str) -> Vec<u8> {
    format!(
        r#"{{"devpayProductCodes":null,"marketplaceProductCodes":null,"availabilityZone":"us-east-2a","privateIp":"10.0.0.5","version":"2017-09-30","region":"us-east-2","instanceId":"i-0fedcba9876543210","billingProducts":null,"instanceType":"m6a.large","accountId":"123456789012","pendingTime":"2026-11-28T10:00:00Z","imageId":"{image}","kernelId":"","ramdiskId":"","architecture":"x86_64"}}"#
    )
    .into_bytes()
}

fn policy(node: &SoftIssuer) -> Policy {
    let pcr4 = hex::encode(&node.pcrs()[&4]);
    Policy::from_attestation_config(
        format!(r#"{{"measurements": {{"4": {{"expected": "{pcr4}"}}}}}}"#).as_bytes(),
    )
    .unwrap()
}

fn ec2() -> Arc<StaticEc2Images> {
    Arc::new(
        StaticEc2Images::new()
            .with_image(ImageRef::new("us-east-2", IMAGE).unwrap(), Some("v2.0"))
            .with_image(
                ImageRef::new("us-east-2", "ami-0000000000000000a").unwrap(),
                None,
            ),
    )
}

#[test]
fn a_listed_key_on_a_tpm_image_joins_and_every_other_case_is_refused_by_name() {
    let node = SoftIssuer::rsa_2048().unwrap();
    let pinned = AwsNitroTpmValidator::new(policy(&node), AkTrust::keys([node.ak_public()]))
        .with_ec2_images(ec2());
    let nonce = [7u8; 32];
    let doc = node
        .issue_document_with_instance_info(b"spki hash", &nonce, Some(&identity(IMAGE)))
        .unwrap();
    let verified = pinned.validate(&doc, &nonce).unwrap();
    assert_eq!(verified.user_data, b"spki hash");
    assert!(
        verified.notes[0].contains("supports TPM v2.0"),
        "{:?}",
        verified.notes
    );
    assert!(
        verified.notes[1].contains("trustedAkDigests"),
        "{:?}",
        verified.notes
    );

    // Another nonce: the quote binds this connection.
    assert!(matches!(
        pinned.validate(&doc, &[8u8; 32]),
        Err(Error::NonceMismatch { .. })
    ));

    // The quote binds InstanceInfo: naming another image after the fact breaks it.
    let tampered = String::from_utf8(doc.clone()).unwrap().replace(
        &base64_of(&identity(IMAGE)),
        &base64_of(&identity("ami-0000000000000000a")),
    );
    assert!(matches!(
        pinned.validate(tampered.as_bytes(), &nonce),
        Err(Error::NonceMismatch { .. })
    ));

    // A key not listed.
    let stranger = SoftIssuer::ecdsa_p256().unwrap();
    let doc2 = stranger
        .issue_document_with_instance_info(b"u", &nonce, Some(&identity(IMAGE)))
        .unwrap();
    let err = pinned.validate(&doc2, &nonce).unwrap_err();
    let want = hex::encode(ak_digest(stranger.ak_public()));
    assert!(
        matches!(&err, Error::UntrustedAk { digest } if *digest == want),
        "{err}"
    );

    // An image without TPM support, and one EC2 does not know.
    for (image, needle) in [
        ("ami-0000000000000000a", "does not support NitroTPM"),
        (
            "ami-0000000000000000b",
            "EC2 knows no image ami-0000000000000000b",
        ),
    ] {
        let doc = node
            .issue_document_with_instance_info(b"u", &nonce, Some(&identity(image)))
            .unwrap();
        let err = pinned.validate(&doc, &nonce).unwrap_err();
        assert!(matches!(err, Error::Binding(_)), "{err}");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }

    // No identity document, or one naming no valid image.
    let bare = node.issue_document(b"u", &nonce).unwrap();
    assert!(matches!(
        pinned.validate(&bare, &nonce),
        Err(Error::Missing(_))
    ));
    let bad = node
        .issue_document_with_instance_info(
            b"u",
            &nonce,
            Some(br#"{"region":"us-east-2","imageId":"ami-x"}"#),
        )
        .unwrap();
    let err = pinned.validate(&bad, &nonce).unwrap_err();
    assert!(err.to_string().contains("imageId \"ami-x\""), "{err}");

    // EC2 down: the node is told to retry; it joins once EC2 answers.
    let down = AwsNitroTpmValidator::new(policy(&node), AkTrust::keys([node.ak_public()]))
        .with_ec2_images(Arc::new(StaticEc2Images::new().unavailable("HTTP 503")));
    assert!(down.validate(&doc, &nonce).unwrap_err().is_unavailable());
}

#[test]
fn trust_any_ak_admits_a_stranger_and_says_so() {
    let node = SoftIssuer::ecdsa_p256().unwrap();
    let any = AwsNitroTpmValidator::new(policy(&node), AkTrust::AnyKey).with_ec2_images(ec2());
    let nonce = [1u8; 32];
    let doc = node
        .issue_document_with_instance_info(b"u", &nonce, Some(&identity(IMAGE)))
        .unwrap();
    let verified = any.validate(&doc, &nonce).unwrap();
    assert!(
        verified.notes[1].contains("trustAnyAk"),
        "{:?}",
        verified.notes
    );
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
