//! Unix-socket listeners that admit one peer uid, and gRPC channels over Unix sockets.

use std::io;
use std::path::{Path, PathBuf};

use futures::Stream;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint};

/// Errors setting up a Unix socket.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket path could not be bound.
    #[error("cannot bind unix socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The socket file's permissions could not be set.
    #[error("cannot set mode {mode:o} on unix socket {path}")]
    Mode {
        path: PathBuf,
        mode: u32,
        #[source]
        source: io::Error,
    },
}

/// Parses a socket file mode given in octal (`660`), for config flags.
pub fn parse_mode(text: &str) -> Result<u32, String> {
    match u32::from_str_radix(text, 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!("{text:?} is not an octal file mode such as 660")),
    }
}

/// Which connecting processes a listener admits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerPolicy {
    allowed_uids: Vec<u32>,
}

impl PeerPolicy {
    /// Admit only processes running as one of these uids.
    pub fn uids(allowed_uids: impl Into<Vec<u32>>) -> Self {
        Self {
            allowed_uids: allowed_uids.into(),
        }
    }

    /// Checks one accepted connection's peer credentials.
    pub fn check(&self, stream: &UnixStream) -> Result<u32, PeerRefused> {
        let cred = stream.peer_cred().map_err(PeerRefused::NoCredentials)?;
        let uid = cred.uid();
        if self.allowed_uids.contains(&uid) {
            Ok(uid)
        } else {
            Err(PeerRefused::Uid {
                uid,
                pid: cred.pid(),
                allowed: self.allowed_uids.clone(),
            })
        }
    }
}

/// Why a connecting process was refused.
#[derive(Debug, thiserror::Error)]
pub enum PeerRefused {
    /// The kernel gave no credentials for the peer.
    #[error("cannot read peer credentials")]
    NoCredentials(#[source] io::Error),
    /// The peer runs as a uid this socket does not serve.
    #[error("peer uid {uid} (pid {pid:?}) is not allowed; this socket serves uid {allowed:?}")]
    Uid {
        uid: u32,
        pid: Option<i32>,
        allowed: Vec<u32>,
    },
}

/// Binds a Unix socket at `path` with permission bits `mode`, replacing a stale socket file left
/// by an earlier run.
///
/// In the pod each peer runs as its own uid, so the client reaches the socket through a group the
/// two containers share (`660`); the peer-credential check of [`incoming`] stays the real fence.
pub fn bind(path: &Path, mode: u32) -> Result<UnixListener, Error> {
    let bind_err = |source| Error::Bind {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(bind_err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        Error::Mode {
            path: path.to_owned(),
            mode,
            source,
        }
    })?;
    Ok(listener)
}

/// The stream of accepted connections whose peer passes `policy`; refused peers are logged and
/// dropped (the kernel closes the connection), and accept errors do not end the stream.
///
/// Suitable for `tonic::transport::Server::serve_with_incoming*`.
pub fn incoming(
    listener: UnixListener,
    policy: PeerPolicy,
) -> impl Stream<Item = io::Result<UnixStream>> {
    futures::stream::unfold((listener, policy), |(listener, policy)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => match policy.check(&stream) {
                    Ok(_) => return Some((Ok(stream), (listener, policy))),
                    Err(refused) => tracing::warn!(error = %refused, "refused unix socket peer"),
                },
                Err(error) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(%error, "unix socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    })
}

/// A gRPC server on a Unix socket that only one peer uid may reach: how token-issuer, the
/// certifier and the cloud-identity sidecars serve the process that calls them.
#[derive(Debug)]
pub struct UnixServer {
    listener: UnixListener,
    socket: PathBuf,
    peer_uid: u32,
}

impl UnixServer {
    /// Binds `socket` with `mode` (see [`bind`]); connections from any uid but `peer_uid` are
    /// closed at accept.
    pub fn bind(socket: &Path, mode: u32, peer_uid: u32) -> Result<Self, Error> {
        Ok(Self {
            listener: bind(socket, mode)?,
            socket: socket.to_owned(),
            peer_uid,
        })
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Serves `routes` until `shutdown` fires, lets calls in flight finish for at most `grace`
    /// ([`crate::shutdown::drain`]), then removes the socket file.
    pub async fn serve(
        self,
        routes: tonic::service::Routes,
        shutdown: crate::shutdown::Shutdown,
        grace: std::time::Duration,
    ) -> Result<(), tonic::transport::Error> {
        let incoming = incoming(self.listener, PeerPolicy::uids([self.peer_uid]));
        let server = tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, shutdown.clone().wait());
        let result = crate::shutdown::drain(server, shutdown, grace).await;
        let _ = std::fs::remove_file(&self.socket);
        result
    }
}

/// Connects to the server on `path` and checks, before anything is sent, that the process
/// listening there runs as `server_uid` (`SO_PEERCRED`).
///
/// A socket path is only a name: whoever can write the directory can replace the socket, and a
/// client that trusted the path would then hand a join request (or a CSR) to that process. The
/// uid the kernel reports for the listening end cannot be forged.
pub async fn connect(path: &Path, server_uid: u32) -> io::Result<UnixStream> {
    let stream = UnixStream::connect(path).await?;
    let uid = stream.peer_cred()?.uid();
    if uid != server_uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            WrongServer {
                path: path.to_owned(),
                uid,
                expected: server_uid,
            },
        ));
    }
    Ok(stream)
}

/// The process serving a socket runs as another uid than the client expects.
#[derive(Debug, thiserror::Error)]
#[error(
    "the server on {path} runs as uid {uid}, not the expected uid {expected}; nothing was sent"
)]
pub struct WrongServer {
    pub path: PathBuf,
    pub uid: u32,
    pub expected: u32,
}

/// A lazily connecting gRPC channel to a server on a Unix socket that must run as `server_uid`
/// (see [`connect`]). The channel reconnects on its own when the server restarts, so one
/// channel serves a process's whole life.
pub fn channel(path: impl Into<PathBuf>, server_uid: u32) -> Channel {
    let path = path.into();
    // The URI is required by the API but unused: the connector below decides where to dial.
    Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(
        move |_| {
            let path = path.clone();
            async move { connect(&path, server_uid).await.map(TokioIo::new) }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn own_uid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        // The uid owning a file we just made is ours; avoids libc for getuid().
        let dir = std::env::temp_dir().join(format!("plumbing-uid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let uid = std::fs::metadata(&dir).unwrap().uid();
        std::fs::remove_dir(&dir).unwrap();
        uid
    }

    #[tokio::test]
    async fn admits_allowed_uid_and_drops_others() {
        let dir = std::env::temp_dir().join(format!("plumbing-test-{}", std::process::id()));
        let path = dir.join("s.sock");
        let me = own_uid();

        let listener = bind(&path, 0o600).unwrap();
        let mut admitted = Box::pin(incoming(listener, PeerPolicy::uids([me])));
        let _client = UnixStream::connect(&path).await.unwrap();
        let stream = admitted.next().await.unwrap().unwrap();
        assert_eq!(stream.peer_cred().unwrap().uid(), me);

        // Same socket path, now serving somebody else: our connection must be dropped.
        let listener = bind(&path, 0o600).unwrap();
        let mut refused = Box::pin(incoming(
            listener,
            PeerPolicy::uids([me.wrapping_add(4242)]),
        ));
        let mut client = UnixStream::connect(&path).await.unwrap();
        let next =
            tokio::time::timeout(std::time::Duration::from_millis(300), refused.next()).await;
        assert!(next.is_err(), "a refused peer must never be yielded");
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1];
        assert_eq!(
            client.read(&mut buf).await.unwrap(),
            0,
            "refused peer sees EOF"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn socket_gets_the_requested_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile_dir("mode");
        let path = dir.join("m.sock");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let _listener = bind(&path, 0o660).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o660
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn modes_parse_as_octal() {
        assert_eq!(parse_mode("660"), Ok(0o660));
        assert_eq!(parse_mode("0600"), Ok(0o600));
        assert!(parse_mode("999").is_err());
        assert!(parse_mode("1777").is_err());
    }

    #[tokio::test]
    async fn a_client_refuses_a_server_of_another_uid() {
        let dir = tempfile_dir("server-uid");
        let path = dir.join("s.sock");
        let me = own_uid();
        let listener = bind(&path, 0o600).unwrap();
        let accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        assert!(connect(&path, me).await.is_ok());
        let refused = connect(&path, me.wrapping_add(4242)).await.unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);
        assert!(
            refused.to_string().contains(&format!("runs as uid {me}")),
            "{refused}"
        );
        // Through a channel, the refusal is a failed call, not a request delivered.
        let request = tonic::codegen::http::Request::new(tonic::body::Body::empty());
        let answer =
            tower::ServiceExt::oneshot(channel(&path, me.wrapping_add(4242)), request).await;
        assert!(answer.is_err(), "a request reached the wrong server");
        accepting.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("plumbing-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
