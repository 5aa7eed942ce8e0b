//! A connection's first TLS record, read in full before the connection may take a handshake
//! place (see [`crate::admission`]), then handed to the TLS server ahead of the rest of the
//! stream.
//!
//! Until then the connection holds its socket, a small task and the bytes it has sent: a client
//! that connects and sends nothing, or stalls inside its first record, pins no TLS state and no
//! handshake place, only a waiting place until the handshake deadline.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TLS record header: content type, legacy version (2 bytes), length (2 bytes).
const HEADER: usize = 5;
/// The content type of a handshake record, which a ClientHello travels in.
const HANDSHAKE: u8 = 0x16;
/// The longest record a peer may send (RFC 8446 §5.1: TLSPlaintext.length ≤ 2^14).
const MAX_RECORD: usize = 1 << 14;

/// A TCP stream whose first bytes were read ahead; reads return them first.
#[derive(Debug)]
pub struct Prefixed {
    head: Vec<u8>,
    served: usize,
    tcp: TcpStream,
}

/// Reads the client's first record: its header, and when it announces a handshake record of a
/// length TLS allows, the whole record. Anything else is handed on as it is, for the TLS server
/// to refuse with its own error. The buffer grows as bytes arrive, so it holds no more than the
/// client sent.
pub async fn read(mut tcp: TcpStream) -> Result<Prefixed, atls::HandshakeError> {
    let mut head = Vec::with_capacity(HEADER);
    read_up_to(&mut tcp, &mut head, HEADER).await?;
    if head.first() == Some(&HANDSHAKE) {
        let length = usize::from(u16::from_be_bytes([head[3], head[4]]));
        if length <= MAX_RECORD {
            read_up_to(&mut tcp, &mut head, length).await?;
        }
    }
    Ok(Prefixed {
        head,
        served: 0,
        tcp,
    })
}

/// Appends exactly `n` more bytes from `tcp` to `head`; the client closing before is an error.
async fn read_up_to(
    tcp: &mut TcpStream,
    head: &mut Vec<u8>,
    n: usize,
) -> Result<(), atls::HandshakeError> {
    let wanted = head.len() + n;
    let limit = u64::try_from(n).unwrap_or(u64::MAX);
    tcp.take(limit)
        .read_to_end(head)
        .await
        .map_err(atls::HandshakeError::Io)?;
    if head.len() < wanted {
        return Err(atls::HandshakeError::UnexpectedEof);
    }
    Ok(())
}

impl AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.served < this.head.len() {
            let n = (this.head.len() - this.served).min(buf.remaining());
            buf.put_slice(&this.head[this.served..this.served + n]);
            this.served += n;
            if this.served == this.head.len() {
                // Handed on in full: the connection keeps no copy.
                this.head = Vec::new();
                this.served = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;
    use tokio::net::TcpListener;

    /// A connected pair: the client's end and the server's accepted end.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn the_first_record_waits_for_all_its_bytes_and_is_read_again_in_order() {
        let (mut client, server) = pair().await;
        let reading = tokio::spawn(read(server));
        let mut record = vec![HANDSHAKE, 3, 1, 0, 4];
        record.extend_from_slice(b"abcd");
        client.write_all(&record[..7]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !reading.is_finished(),
            "returned before the record was whole"
        );
        client.write_all(&record[7..]).await.unwrap();
        client.write_all(b"rest").await.unwrap();
        client.shutdown().await.unwrap();
        let mut stream = reading.await.unwrap().unwrap();
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, [record.as_slice(), b"rest"].concat());
    }

    #[tokio::test]
    async fn a_client_that_closes_inside_its_first_record_is_an_error() {
        let (mut client, server) = pair().await;
        client.write_all(&[HANDSHAKE, 3, 1, 2, 0, 1]).await.unwrap();
        drop(client);
        assert!(matches!(
            read(server).await,
            Err(atls::HandshakeError::UnexpectedEof)
        ));
    }

    #[tokio::test]
    async fn what_is_not_a_handshake_record_is_handed_on_after_its_header() {
        for header in [
            b"GET /".to_vec(),
            // A handshake record longer than TLS allows.
            vec![HANDSHAKE, 3, 1, 0x40, 0x01],
        ] {
            let (mut client, server) = pair().await;
            client.write_all(&header).await.unwrap();
            let mut stream = read(server).await.unwrap();
            let mut got = [0u8; HEADER];
            stream.read_exact(&mut got).await.unwrap();
            assert_eq!(got.as_slice(), header.as_slice());
        }
    }
}
