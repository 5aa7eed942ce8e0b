//! Helpers the stand-in's test files share.

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_standin::Running;

/// A kube-rs client for `s`, authenticating with `token`.
pub async fn client(s: &Running, token: &str) -> Client {
    let kc = Kubeconfig::from_yaml(&s.kubeconfig(token)).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// The `Status` of an API error; panics on any other error.
pub fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}
