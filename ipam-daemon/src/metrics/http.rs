//! A small HTTP/1.1 server for `/metrics`, `/healthz` and `/readyz`: GET only, one request per
//! connection. Scrapers and probes need no more, and the daemon links no HTTP framework for it.

use std::{sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};

use super::{Health, Metrics};

/// Longest time a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves until the listener fails.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, health: Arc<Health>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (metrics, health) = (metrics.clone(), health.clone());
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &metrics, &health).await {
                tracing::debug!("metrics endpoint: {e}");
            }
        });
    }
}

async fn answer(mut stream: TcpStream, metrics: &Metrics, health: &Health) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    // Up to the end of the headers; a request line is all that is used.
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        let n = tokio::time::timeout(READ_TIMEOUT, stream.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::other("request timed out"))??;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&request);
    let open_metrics = line.lines().any(|h| {
        h.to_ascii_lowercase().starts_with("accept:") && h.contains("application/openmetrics-text")
    });
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = match (method, path.split('?').next().unwrap_or("")) {
        // OpenMetrics for those who ask for it (Prometheus does), the classic text otherwise.
        ("GET", "/metrics") if open_metrics => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.encode_text(),
        ),
        ("GET", "/healthz") => ("200 OK", "text/plain; charset=utf-8", "ok\n".to_owned()),
        ("GET", "/readyz") => {
            let (ready, body) = health.report();
            (
                if ready {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                },
                "text/plain; charset=utf-8",
                body,
            )
        }
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found; try /metrics, /healthz or /readyz\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n".to_owned(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
