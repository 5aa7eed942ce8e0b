//! Key service configuration: flags with environment fallbacks. Tests build [`Config`] directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use plumbing::telemetry::LogFormat;
use zeroize::Zeroizing;

use crate::Error;
use crate::derive::MasterSecret;

/// Constellation-compatible key service: serves kms.API (plaintext gRPC) in
/// Constellation-managed mode.
///
/// The master secret and salt come from files (in a cluster: the keys `mastersecret` and `salt`
/// of Constellation's `constellation-mastersecret` Secret, mounted as files) holding the raw
/// bytes. A trailing newline is part of the secret, so write such files with `printf`, not
/// `echo`. For local runs each may instead be given as hex on the command line; that puts the
/// secret into the process arguments or environment, so never do it in a cluster.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "keyservice",
    version,
    about = "Constellation-compatible key service (kms.API)"
)]
pub struct Config {
    /// Address to serve kms.API on (plaintext gRPC). Port 0 picks a free port.
    #[arg(long, env = "KEYSERVICE_LISTEN", default_value = "0.0.0.0:9000")]
    pub listen: SocketAddr,

    /// File holding the master secret, raw bytes.
    #[arg(
        long,
        env = "KEYSERVICE_MASTER_SECRET_FILE",
        required_unless_present = "master_secret_hex"
    )]
    pub master_secret_file: Option<PathBuf>,

    /// File holding the master salt, raw bytes.
    #[arg(
        long,
        env = "KEYSERVICE_MASTER_SALT_FILE",
        required_unless_present = "master_salt_hex"
    )]
    pub master_salt_file: Option<PathBuf>,

    /// The master secret as hex, instead of a file. Local runs only.
    #[arg(
        long,
        env = "KEYSERVICE_MASTER_SECRET_HEX",
        conflicts_with = "master_secret_file",
        hide_env_values = true
    )]
    pub master_secret_hex: Option<HexBytes>,

    /// The master salt as hex, instead of a file. Local runs only.
    #[arg(
        long,
        env = "KEYSERVICE_MASTER_SALT_HEX",
        conflicts_with = "master_salt_file",
        hide_env_values = true
    )]
    pub master_salt_hex: Option<HexBytes>,

    /// How long in-flight requests get to finish after SIGTERM (e.g. `20s`). Keep it below the
    /// pod's terminationGracePeriodSeconds.
    #[arg(long, env = "KEYSERVICE_GRACE_PERIOD", default_value = "20s", value_parser = humantime::parse_duration)]
    pub grace_period: Duration,

    /// Log line format.
    #[arg(long, env = "KEYSERVICE_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
}

impl Config {
    /// A configuration with the master secret and salt given inline, for local runs and tests.
    pub fn local(listen: SocketAddr, secret: &[u8], salt: &[u8]) -> Self {
        Self {
            listen,
            master_secret_file: None,
            master_salt_file: None,
            master_secret_hex: Some(HexBytes(Zeroizing::new(secret.to_vec()))),
            master_salt_hex: Some(HexBytes(Zeroizing::new(salt.to_vec()))),
            grace_period: Duration::from_secs(5),
            log_format: LogFormat::Text,
        }
    }

    /// Reads and checks the master secret and salt.
    pub fn load_master_secret(&self) -> Result<MasterSecret, Error> {
        let secret = load(
            "master secret",
            &self.master_secret_file,
            &self.master_secret_hex,
        )?;
        let salt = load("master salt", &self.master_salt_file, &self.master_salt_hex)?;
        MasterSecret::new(secret, salt).map_err(Error::MasterSecret)
    }
}

fn load(
    what: &'static str,
    file: &Option<PathBuf>,
    inline: &Option<HexBytes>,
) -> Result<Zeroizing<Vec<u8>>, Error> {
    match (file, inline) {
        (Some(path), None) => {
            std::fs::read(path)
                .map(Zeroizing::new)
                .map_err(|source| Error::ReadSecret {
                    what,
                    path: path.clone(),
                    source,
                })
        }
        (None, Some(bytes)) => Ok(bytes.0.clone()),
        (Some(_), Some(_)) => Err(Error::SecretSource {
            what,
            problem: "given both as a file and as hex",
        }),
        (None, None) => Err(Error::SecretSource {
            what,
            problem: "not configured",
        }),
    }
}

/// Bytes given as hex on the command line; wiped from memory when dropped, and never printed.
#[derive(Clone)]
pub struct HexBytes(pub Zeroizing<Vec<u8>>);

impl std::fmt::Debug for HexBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes redacted>", self.0.len())
    }
}

impl std::str::FromStr for HexBytes {
    type Err = hex::FromHexError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        hex::decode(s.trim()).map(|bytes| HexBytes(Zeroizing::new(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn flags_parse_and_hex_is_redacted() {
        let config = Config::try_parse_from([
            "keyservice",
            "--listen",
            "127.0.0.1:0",
            "--master-secret-hex",
            "000102030405060708090a0b0c0d0e0f",
            "--master-salt-hex",
            "ff",
            "--grace-period",
            "500ms",
        ])
        .unwrap();
        assert_eq!(config.grace_period, Duration::from_millis(500));
        assert!(!format!("{config:?}").contains("0a0b"));
        config.load_master_secret().unwrap();
    }

    #[test]
    fn secret_source_is_required_and_exclusive() {
        assert!(Config::try_parse_from(["keyservice", "--master-salt-hex", "ff"]).is_err());
        assert!(
            Config::try_parse_from([
                "keyservice",
                "--master-secret-hex",
                "00",
                "--master-secret-file",
                "/x",
                "--master-salt-hex",
                "ff"
            ])
            .is_err()
        );
    }

    #[test]
    fn files_are_read_raw() {
        let dir = tempfile::tempdir().unwrap();
        let (secret, salt) = (dir.path().join("secret"), dir.path().join("salt"));
        std::fs::write(&secret, [5u8; 32]).unwrap();
        std::fs::write(&salt, b"salt\n").unwrap();
        let mut config = Config::local("127.0.0.1:0".parse().unwrap(), &[], &[]);
        config.master_secret_hex = None;
        config.master_salt_hex = None;
        config.master_secret_file = Some(secret);
        config.master_salt_file = Some(salt.clone());
        let from_files = config.load_master_secret().unwrap();
        let inline = Config::local("127.0.0.1:0".parse().unwrap(), &[5u8; 32], b"salt\n")
            .load_master_secret()
            .unwrap();
        assert_eq!(
            from_files.derive_key("k", 32).unwrap(),
            inline.derive_key("k", 32).unwrap()
        );

        std::fs::remove_file(&salt).unwrap();
        let err = config.load_master_secret().unwrap_err();
        assert!(
            matches!(
                err,
                Error::ReadSecret {
                    what: "master salt",
                    ..
                }
            ),
            "{err}"
        );
    }
}
