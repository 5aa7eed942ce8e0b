//! An async TLS stream over a rustls 0.24 connection and a tokio transport.
//!
//! rustls 0.24's `Connection` does no I/O: we feed it received bytes through a
//! [`TlsInputBuffer`], it appends records to send to a `Vec<u8>` and decrypted application data
//! to another. This module moves bytes between those buffers and the transport:
//!
//! - reading: fill the input buffer from the transport, let rustls process every complete
//!   record, hand out the plaintext. A `close_notify` from the peer is a clean EOF; a transport
//!   EOF without one is an `UnexpectedEof` error (a truncation we must not hide).
//! - writing: encrypt into the output buffer and push it to the transport. Backpressure: new
//!   plaintext is only accepted once earlier records have been handed to the transport, so at
//!   most one chunk is ever buffered.
//! - protocol output produced while reading (alerts, key-update responses) is pushed to the
//!   transport opportunistically from the read path too, since a reader may never write.
//! - shutdown queues `close_notify`, flushes, then shuts the transport down.
//!
//! Wakeups: every `Pending` we return comes straight from a transport poll made in the same
//! call, so the transport has registered the task's waker.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use rustls::client::ClientSide;
use rustls::crypto::Identity;
use rustls::crypto::cipher::OutboundPlain;
use rustls::server::ServerSide;
use rustls::{Connection, ConnectionOutputs, SideData, Tcp, TlsInputBuffer};
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::runtime::{Handle, RuntimeFlavor};

use crate::error::HandshakeError;

/// Bytes requested from the transport per read: one full TLS record and its overhead.
const READ_CHUNK: usize = 16 * 1024 + 2048 + 5;
/// Received-but-unprocessed bytes we hold at most. rustls reassembles a handshake message (at
/// most 64 KiB) in this buffer, plus one partial record behind it; more is a misbehaving peer.
const MAX_BUFFERED_INPUT: usize = 128 * 1024;
/// Plaintext encrypted per `poll_write`; rustls splits it into records.
const MAX_WRITE_CHUNK: usize = 64 * 1024;

/// An established TLS connection over `IO`; the result of [`Acceptor::accept`] and
/// [`Connector::connect`].
///
/// [`Acceptor::accept`]: crate::Acceptor::accept
/// [`Connector::connect`]: crate::Connector::connect
pub struct TlsStream<IO> {
    io: IO,
    conn: Conn,
    input: InputBuffer,
    plaintext: Vec<u8>,
    plaintext_read: usize,
    outgoing: Vec<u8>,
    outgoing_written: usize,
    /// The peer sent `close_notify`: reads return EOF once `plaintext` is drained.
    read_closed: bool,
    /// We queued our `close_notify`.
    write_closed: bool,
}

enum Conn {
    Client(Connection<ClientSide, Tcp>),
    Server(Connection<ServerSide, Tcp>),
}

impl Conn {
    fn process(
        &mut self,
        input: &mut InputBuffer,
        outgoing: &mut Vec<u8>,
        plaintext: &mut Vec<u8>,
    ) -> Result<bool, rustls::Error> {
        fn run<S: SideData>(
            conn: &mut Connection<S, Tcp>,
            input: &mut InputBuffer,
            outgoing: &mut Vec<u8>,
            plaintext: &mut Vec<u8>,
        ) -> Result<bool, rustls::Error> {
            let state = conn.read_tls(input, outgoing).handle_all(plaintext)?;
            Ok(state.peer_has_closed())
        }
        match self {
            Conn::Client(c) => run(c, input, outgoing, plaintext),
            Conn::Server(c) => run(c, input, outgoing, plaintext),
        }
    }

    /// Encrypts the concatenation of `chunks` (records of at most 16 KiB each) into `outgoing`.
    fn write(&mut self, chunks: &[&[u8]], outgoing: &mut Vec<u8>) -> Result<(), rustls::Error> {
        let plain = OutboundPlain::new(chunks);
        match self {
            Conn::Client(c) => c.write(plain, outgoing),
            Conn::Server(c) => c.write(plain, outgoing),
        }
    }

    fn send_close_notify(&mut self, outgoing: &mut Vec<u8>) -> Result<(), rustls::Error> {
        match self {
            Conn::Client(c) => c.send_close_notify(outgoing),
            Conn::Server(c) => c.send_close_notify(outgoing),
        }
    }

    fn is_handshaking(&self) -> bool {
        match self {
            Conn::Client(c) => c.is_handshaking(),
            Conn::Server(c) => c.is_handshaking(),
        }
    }

    fn outputs(&self) -> &ConnectionOutputs {
        match self {
            Conn::Client(c) => c,
            Conn::Server(c) => c,
        }
    }
}

impl<IO> TlsStream<IO> {
    pub(crate) fn new_server(io: IO, conn: Connection<ServerSide, Tcp>) -> Self {
        Self::new(io, Conn::Server(conn), Vec::new())
    }

    /// `client_hello` is what rustls wrote when the connection was built.
    pub(crate) fn new_client(
        io: IO,
        conn: Connection<ClientSide, Tcp>,
        client_hello: Vec<u8>,
    ) -> Self {
        Self::new(io, Conn::Client(conn), client_hello)
    }

    fn new(io: IO, conn: Conn, outgoing: Vec<u8>) -> Self {
        Self {
            io,
            conn,
            input: InputBuffer::default(),
            plaintext: Vec::new(),
            plaintext_read: 0,
            outgoing,
            outgoing_written: 0,
            read_closed: false,
            write_closed: false,
        }
    }

    /// The negotiated ALPN protocol, e.g. `b"h2"`.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.conn.outputs().alpn_protocol().map(|p| p.as_ref())
    }

    /// The transport.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// The peer's end-entity certificate, if it presented one; on a node's connection, the
    /// service's certificate its [`ServerPolicy`](crate::ServerPolicy) accepted.
    pub fn peer_end_entity(&self) -> Option<CertificateDer<'static>> {
        match &**self.conn.outputs().peer_identity()? {
            Identity::X509(cert) => Some(cert.end_entity.clone()),
            _ => None,
        }
    }

    /// Whether the handshake was full or resumed (for tests that resumption stays off).
    #[cfg(test)]
    pub(crate) fn handshake_kind(&self) -> Option<rustls::HandshakeKind> {
        self.conn.outputs().handshake_kind()
    }

    /// TLS 1.3 tickets a client connection received.
    #[cfg(test)]
    pub(crate) fn tls13_tickets_received(&self) -> u32 {
        match &self.conn {
            Conn::Client(c) => c.tls13_tickets_received(),
            Conn::Server(_) => 0,
        }
    }

    /// Lets rustls process what has been received; records whether the peer closed.
    fn process(&mut self) -> Result<(), rustls::Error> {
        let peer_closed =
            self.conn
                .process(&mut self.input, &mut self.outgoing, &mut self.plaintext)?;
        self.read_closed |= peer_closed;
        Ok(())
    }
}

impl TlsStream<TcpStream> {
    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.io.peer_addr()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> TlsStream<IO> {
    /// Drives the handshake to completion.
    ///
    /// `blocking_callbacks`: rustls calls our certificate callbacks from inside record
    /// processing, and the client's callback runs the attestation issuer, which may block. On
    /// a multi-thread runtime that processing then runs under `block_in_place`, so other tasks
    /// move to another worker meanwhile.
    pub(crate) async fn handshake(
        &mut self,
        blocking_callbacks: bool,
    ) -> Result<(), HandshakeError> {
        let mut failure = None;
        poll_fn(|cx| self.poll_handshake(cx, blocking_callbacks, &mut failure)).await
    }

    fn poll_handshake(
        &mut self,
        cx: &mut Context<'_>,
        blocking_callbacks: bool,
        failure: &mut Option<rustls::Error>,
    ) -> Poll<Result<(), HandshakeError>> {
        loop {
            let flushed = self.poll_flush_outgoing(cx);
            if let Some(error) = failure.take() {
                // Deliver the alert rustls queued before giving up, so the peer learns why.
                if flushed.is_pending() {
                    *failure = Some(error);
                    return Poll::Pending;
                }
                return Poll::Ready(Err(HandshakeError::Tls(error)));
            }
            ready!(flushed).map_err(HandshakeError::Io)?;

            if !self.conn.is_handshaking() {
                return Poll::Ready(Ok(()));
            }
            if self.input.eof || self.read_closed {
                return Poll::Ready(Err(HandshakeError::UnexpectedEof));
            }
            ready!(self.input.poll_fill(&mut self.io, cx)).map_err(HandshakeError::Io)?;

            let result = if blocking_callbacks {
                run_blocking(|| self.process())
            } else {
                self.process()
            };
            if let Err(error) = result {
                *failure = Some(error);
            }
        }
    }

    /// Encrypts the concatenation of `chunks` (up to [`MAX_WRITE_CHUNK`] bytes of it) and
    /// starts sending it; returns how many bytes were taken.
    fn poll_write_chunks(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &[&[u8]],
    ) -> Poll<io::Result<usize>> {
        // The chunks, cut so that together they are at most MAX_WRITE_CHUNK long.
        let mut taken: Vec<&[u8]> = Vec::with_capacity(chunks.len());
        let mut n = 0;
        for chunk in chunks {
            let room = MAX_WRITE_CHUNK - n;
            if room == 0 {
                break;
            }
            let part = &chunk[..chunk.len().min(room)];
            if !part.is_empty() {
                taken.push(part);
                n += part.len();
            }
        }
        if n == 0 {
            return Poll::Ready(Ok(0));
        }
        ready!(self.poll_flush_outgoing(cx))?;
        self.conn
            .write(&taken, &mut self.outgoing)
            .map_err(tls_io_error)?;
        // Start sending; what the transport does not take now goes out on the next write or
        // flush. The data is ours either way, so report it written.
        if let Poll::Ready(Err(e)) = self.poll_flush_outgoing(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    /// Writes queued TLS records to the transport.
    fn poll_flush_outgoing(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.outgoing_written < self.outgoing.len() {
            let pending = &self.outgoing[self.outgoing_written..];
            match ready!(Pin::new(&mut self.io).poll_write(cx, pending)) {
                Ok(0) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "transport accepted no TLS data",
                    )));
                }
                Ok(n) => self.outgoing_written += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        self.outgoing.clear();
        self.outgoing_written = 0;
        Poll::Ready(Ok(()))
    }
}

/// See [`TlsStream::handshake`].
fn run_blocking<R>(f: impl FnOnce() -> R) -> R {
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

fn tls_io_error(error: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.plaintext_read < this.plaintext.len() {
                let available = &this.plaintext[this.plaintext_read..];
                let n = available.len().min(buf.remaining());
                buf.put_slice(&available[..n]);
                this.plaintext_read += n;
                if this.plaintext_read == this.plaintext.len() {
                    this.plaintext.clear();
                    this.plaintext_read = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            if this.input.eof {
                // Every complete record was processed after the last read, so whatever is left
                // is a truncated stream.
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection without a TLS close_notify",
                )));
            }
            // A Pending flush must not stop us from reading: the peer may be waiting for us to
            // drain its data before it reads ours.
            if let Poll::Ready(Err(e)) = this.poll_flush_outgoing(cx) {
                return Poll::Ready(Err(e));
            }
            ready!(this.input.poll_fill(&mut this.io, cx))?;
            if let Err(error) = this.process() {
                // Best effort to deliver the alert; the error is what matters.
                let _ = this.poll_flush_outgoing(cx);
                return Poll::Ready(Err(tls_io_error(error)));
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_chunks(cx, &[buf])
    }

    /// HTTP/2 hands a frame's header and its payload as separate slices. Taken together they
    /// become one TLS record and one write to the transport instead of one of each per slice
    /// (a join's answer went out as three records, now two).
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let chunks: Vec<&[u8]> = bufs.iter().map(|b| &**b).collect();
        self.get_mut().poll_write_chunks(cx, &chunks)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_flush_outgoing(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.write_closed {
            this.write_closed = true;
            this.conn
                .send_close_notify(&mut this.outgoing)
                .map_err(tls_io_error)?;
        }
        ready!(this.poll_flush_outgoing(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl<IO: fmt::Debug> fmt::Debug for TlsStream<IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsStream")
            .field("io", &self.io)
            .field("handshaking", &self.conn.is_handshaking())
            .field("read_closed", &self.read_closed)
            .field("write_closed", &self.write_closed)
            .finish_non_exhaustive()
    }
}

/// Received TLS bytes that rustls has not consumed yet.
///
/// rustls decrypts in place and may keep partially reassembled handshake messages here between
/// calls, so the buffer only ever grows at the end and shrinks at the front when rustls says so.
#[derive(Debug, Default)]
struct InputBuffer {
    buf: Vec<u8>,
    eof: bool,
    close_notify: bool,
}

impl InputBuffer {
    /// Reads once from `io`. A zero-byte read marks EOF.
    fn poll_fill<IO: AsyncRead + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let filled = self.buf.len();
        if filled >= MAX_BUFFERED_INPUT {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "peer sent more unprocessable TLS data than the buffer limit",
            )));
        }
        let want = READ_CHUNK.min(MAX_BUFFERED_INPUT - filled);
        self.buf.resize(filled + want, 0);
        let mut read_buf = ReadBuf::new(&mut self.buf[filled..]);
        let result = Pin::new(io).poll_read(cx, &mut read_buf);
        let n = read_buf.filled().len();
        self.buf.truncate(filled + n);
        match result {
            Poll::Ready(Ok(())) => {
                if n == 0 {
                    self.eof = true;
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl TlsInputBuffer for InputBuffer {
    fn slice_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    fn discard(&mut self, num_bytes: usize) {
        // rustls never discards more than it was shown; `min` keeps that an invariant here.
        let n = num_bytes.min(self.buf.len());
        self.buf.drain(..n);
    }

    fn received_close_notify(&mut self) {
        self.close_notify = true;
    }

    fn has_seen_eof(&self) -> bool {
        self.eof
    }
}
