//! A TCP relay that counts what passes each way: a client in another network namespace
//! reaches a server on the host's loopback through it (a listener bound in the namespace), and
//! the benchmarks read how many bytes that one client sent and received (TLS included, as on
//! the wire).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::tcp::{OwnedReadHalf, OwnedWriteHalf},
};

/// Bytes relayed so far, each way.
#[derive(Debug, Default)]
pub struct Traffic {
    to_server: AtomicU64,
    from_server: AtomicU64,
}

impl Traffic {
    /// Bytes the client sent to the server.
    pub fn sent(&self) -> u64 {
        self.to_server.load(Ordering::Relaxed)
    }

    /// Bytes the server sent to the client.
    pub fn received(&self) -> u64 {
        self.from_server.load(Ordering::Relaxed)
    }
}

/// Relays every connection `listener` accepts to `server`, for as long as the runtime runs.
pub struct Relay;

impl Relay {
    /// Starts relaying; must be called within a tokio runtime. Returns the listener's address
    /// and the running count.
    pub fn start(
        listener: std::net::TcpListener,
        server: SocketAddr,
    ) -> std::io::Result<(SocketAddr, Arc<Traffic>)> {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let address = listener.local_addr()?;
        let traffic = Arc::new(Traffic::default());
        let counted = traffic.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let traffic = counted.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(server).await else {
                        return;
                    };
                    let (client_read, client_write) = inbound.into_split();
                    let (server_read, server_write) = outbound.into_split();
                    tokio::join!(
                        pump(client_read, server_write, &traffic.to_server),
                        pump(server_read, client_write, &traffic.from_server),
                    );
                });
            }
        });
        Ok((address, traffic))
    }
}

/// Copies `from` to `to` until either side closes, counting into `count`.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, count: &AtomicU64) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}
