//! A crowd of connections that connect to the service and then do not talk: half send nothing,
//! half send the first bytes of a TLS record announcing a ClientHello and stall there. Each comes
//! from its own loopback address (so per-source limits do not stop it) and is opened again as
//! soon as the server closes it, so the crowd stays the same size for as long as it is held: the
//! cheapest way to pin a server's connection places, run beside real joins to see whether they
//! slow down.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::node::loopback_source;

/// Where the crowd's source addresses start (in [`loopback_source`]'s numbering), far beyond any
/// node index a run uses, so a crowd member never shares a node's address.
pub const FIRST_SOURCE: u64 = 8 << 20;

/// Connections being opened at once: faster only tests the kernel's listen queue.
const OPENING_AT_ONCE: usize = 64;

/// A member's pause before it connects again after a refused connect, so that a server which
/// refuses at once is not hammered in a loop.
const PAUSE_AFTER_REFUSAL: Duration = Duration::from_millis(100);

/// The first bytes a stalling member sends: a handshake record header announcing 512 bytes,
/// and one byte of them.
const STALLED_HELLO: [u8; 6] = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01];

/// What the crowd saw while it was held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CrowdStats {
    /// Members.
    pub size: usize,
    /// Connections opened, first ones and re-openings.
    pub opened: u64,
    /// Connections the server closed (at accept, at its deadline, or in between).
    pub closed_by_server: u64,
    /// Connects that failed (the server's listen queue full, out of ports or descriptors).
    pub connect_failures: u64,
}

#[derive(Debug, Default)]
struct Counts {
    open: AtomicUsize,
    opened: AtomicU64,
    closed_by_server: AtomicU64,
    connect_failures: AtomicU64,
}

/// A crowd being held; [`Crowd::stop`] closes every member.
#[derive(Debug)]
pub struct Crowd {
    size: usize,
    stop: watch::Sender<bool>,
    members: JoinSet<()>,
    counts: Arc<Counts>,
}

impl Crowd {
    /// Opens `size` members against `target` and returns once each has connected (or failed to)
    /// once. Raises this process's open-file limit to fit them.
    pub async fn hold(target: SocketAddr, size: usize) -> std::io::Result<Self> {
        let wanted = u64::try_from(size).unwrap_or(u64::MAX).saturating_add(4096);
        let limit = rlimit::increase_nofile_limit(wanted)?;
        if limit < wanted {
            return Err(std::io::Error::other(format!(
                "the open-file limit is {limit}; a crowd of {size} beside the nodes needs {wanted}"
            )));
        }
        let (stop, stopped) = watch::channel(false);
        let counts = Arc::new(Counts::default());
        let opening = Arc::new(tokio::sync::Semaphore::new(OPENING_AT_ONCE));
        let (first_done, mut all_connected) = tokio::sync::mpsc::channel::<()>(size.max(1));
        let mut members = JoinSet::new();
        for index in 0..size {
            let member = Member {
                target,
                source: FIRST_SOURCE + u64::try_from(index).unwrap_or(u64::MAX),
                stalls: index % 2 == 1,
                counts: counts.clone(),
            };
            let (opening, stopped, first_done) =
                (opening.clone(), stopped.clone(), first_done.clone());
            members.spawn(member.run(opening, stopped, first_done));
        }
        drop(first_done);
        // Every member sends once after its first connect (or failure), then drops its sender.
        while all_connected.recv().await.is_some() {}
        Ok(Self {
            size,
            stop,
            members,
            counts,
        })
    }

    /// Members connected now.
    pub fn open(&self) -> usize {
        self.counts.open.load(Ordering::Relaxed)
    }

    /// What the crowd saw so far.
    pub fn stats(&self) -> CrowdStats {
        CrowdStats {
            size: self.size,
            opened: self.counts.opened.load(Ordering::Relaxed),
            closed_by_server: self.counts.closed_by_server.load(Ordering::Relaxed),
            connect_failures: self.counts.connect_failures.load(Ordering::Relaxed),
        }
    }

    /// Closes every member and returns what the crowd saw.
    pub async fn stop(mut self) -> CrowdStats {
        let _ = self.stop.send(true);
        while self.members.join_next().await.is_some() {}
        self.stats()
    }
}

struct Member {
    target: SocketAddr,
    source: u64,
    stalls: bool,
    counts: Arc<Counts>,
}

impl Member {
    async fn run(
        self,
        opening: Arc<tokio::sync::Semaphore>,
        mut stopped: watch::Receiver<bool>,
        first_done: tokio::sync::mpsc::Sender<()>,
    ) {
        let mut first_done = Some(first_done);
        while !*stopped.borrow() {
            let connected = {
                let Ok(_permit) = opening.acquire().await else {
                    return;
                };
                self.connect().await
            };
            if let Some(done) = first_done.take() {
                let _ = done.send(()).await;
            }
            let Ok(mut tcp) = connected else {
                self.counts.connect_failures.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    () = tokio::time::sleep(PAUSE_AFTER_REFUSAL) => continue,
                    _ = stopped.changed() => return,
                }
            };
            self.counts.opened.fetch_add(1, Ordering::Relaxed);
            self.counts.open.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                () = held(&mut tcp, self.stalls) => {
                    self.counts.closed_by_server.fetch_add(1, Ordering::Relaxed);
                }
                _ = stopped.changed() => {}
            }
            self.counts.open.fetch_sub(1, Ordering::Relaxed);
        }
    }

    async fn connect(&self) -> std::io::Result<TcpStream> {
        let socket = match self.target {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        if self.target.ip().is_loopback() && self.target.is_ipv4() {
            socket.bind(SocketAddr::new(loopback_source(self.source), 0))?;
        }
        socket.connect(self.target).await
    }
}

/// Holds one connection (stalling inside a ClientHello or silent) until the server closes it.
async fn held(tcp: &mut TcpStream, stalls: bool) {
    if stalls && tcp.write_all(&STALLED_HELLO).await.is_err() {
        return;
    }
    let mut buf = [0u8; 64];
    // EOF, a reset, or bytes the server sent (an alert): the wait ends when the connection does.
    loop {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// One load run three times against the same service, without a crowd, beside a held crowd, and
/// without again, so that the machine's drift shows apart from the crowd's effect.
#[derive(Debug, serde::Serialize)]
pub struct Beside {
    pub before: crate::Report,
    pub with_crowd: crate::Report,
    pub after: crate::Report,
    pub crowd: CrowdStats,
    /// Crowd members connected when the run beside it ended.
    pub held_at_end: usize,
}

impl Beside {
    /// Joins per second beside the crowd over the mean of the runs without.
    pub fn throughput_ratio(&self) -> f64 {
        let without = (self.before.joins_per_second + self.after.joins_per_second) / 2.0;
        self.with_crowd.joins_per_second / without
    }
}

impl std::fmt::Display for Beside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "== without a crowd\n{}== beside a crowd of {} held connections\n{}== without a crowd, again\n{}",
            self.before, self.crowd.size, self.with_crowd, self.after
        )?;
        writeln!(
            f,
            "{:<14} {:>10} {:>10} {:>14} {:>8}",
            "run", "joins/s", "p99 ms", "cpu ms/join", "failed"
        )?;
        for (name, report) in [
            ("before", &self.before),
            ("beside crowd", &self.with_crowd),
            ("after", &self.after),
        ] {
            writeln!(
                f,
                "{name:<14} {:>10.0} {:>10.1} {:>14} {:>8}",
                report.joins_per_second,
                report.latency.p99_ms,
                report
                    .server_cpu_ms_per_join
                    .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.3}")),
                report.failed
            )?;
        }
        writeln!(
            f,
            "joins/s beside the crowd / mean without: {:.3}; crowd: {} held at the end of its run, {} connections opened, {} closed by the server, {} connects failed",
            self.throughput_ratio(),
            self.held_at_end,
            self.crowd.opened,
            self.crowd.closed_by_server,
            self.crowd.connect_failures
        )
    }
}
