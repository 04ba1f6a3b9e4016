//! A client connection's socket as hyper sees it: reads mark the connection as having bytes
//! on their way (`Connection::received`), and hyper's automatic parse-error answers are
//! written with OpenAI error bodies instead (`error_bodies`).

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::connections::Connection;
use super::error_bodies::{poll_write_replacing, Replacing};

pub struct ClientSocket {
    stream: TcpStream,
    connection: Arc<Connection>,
    replacing: Replacing,
}

impl ClientSocket {
    pub fn new(stream: TcpStream, connection: Arc<Connection>) -> Self {
        Self {
            stream,
            connection,
            replacing: Replacing::default(),
        }
    }
}

impl ClientSocket {
    /// Writes `bytes` (as they are: not an answer of hyper's) and closes the sending side.
    pub async fn send_and_close(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut sent = 0;
        while sent < bytes.len() {
            let left = &bytes[sent..];
            let n =
                std::future::poll_fn(|cx| Pin::new(&mut self.stream).poll_write(cx, left)).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            sent += n;
        }
        self.close().await
    }

    /// Closes the sending side.
    pub async fn close(&mut self) -> io::Result<()> {
        std::future::poll_fn(|cx| Pin::new(&mut self.stream).poll_shutdown(cx)).await
    }
}

impl AsyncRead for ClientSocket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.connection.received.store(true, Ordering::Release);
        }
        polled
    }
}

impl AsyncWrite for ClientSocket {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        poll_write_replacing(&mut this.stream, &mut this.replacing, cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
