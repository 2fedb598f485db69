//! The HTTP endpoints for monitoring: `/metrics`, `/healthz` and `/readyz`, served by axum (on
//! hyper), so keep-alive, pipelining, methods and malformed requests are handled by a server
//! many projects keep, not by code of ours.

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::net::TcpListener;

use super::{Health, Metrics};

const TEXT: &str = "text/plain; charset=utf-8";

#[derive(Clone)]
struct Served {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// Serves until the listener fails.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, health: Arc<Health>) {
    if let Err(e) = axum::serve(listener, router(Served { metrics, health })).await {
        tracing::error!("metrics endpoint stopped: {e}");
    }
}

fn router(served: Served) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route(
            "/healthz",
            get(|| async { ([(header::CONTENT_TYPE, TEXT)], "ok\n") }),
        )
        .route("/readyz", get(readyz))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                [(header::CONTENT_TYPE, TEXT)],
                "not found; try /metrics, /healthz or /readyz\n",
            )
        })
        .with_state(served)
}

/// OpenMetrics for those who ask for it (Prometheus does), the classic text otherwise.
async fn metrics(State(served): State<Served>, headers: HeaderMap) -> Response {
    let open_metrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if open_metrics {
        let kind = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        ([(header::CONTENT_TYPE, kind)], served.metrics.encode()).into_response()
    } else {
        let kind = "text/plain; version=0.0.4; charset=utf-8";
        ([(header::CONTENT_TYPE, kind)], served.metrics.encode_text()).into_response()
    }
}

async fn readyz(State(served): State<Served>) -> Response {
    let (ready, body) = served.health.report();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, [(header::CONTENT_TYPE, TEXT)], body).into_response()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// Sends one request over loopback and returns the status line and the body.
    async fn ask(address: std::net::SocketAddr, request: &str) -> (String, String) {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut text = String::new();
        stream.read_to_string(&mut text).await.expect("read");
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        (
            head.lines().next().unwrap_or("").to_owned(),
            body.to_owned(),
        )
    }

    #[tokio::test]
    async fn answers_each_path_and_refuses_other_methods_and_paths() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let health = Arc::new(Health::default());
        tokio::spawn(serve(listener, Arc::new(Metrics::new()), health.clone()));
        let get =
            |path: &str| format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");

        let (status, body) = ask(address, &get("/healthz")).await;
        assert_eq!(
            (status.as_str(), body.as_str()),
            ("HTTP/1.1 200 OK", "ok\n")
        );

        let (status, body) = ask(address, &get("/readyz")).await;
        assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
        assert_eq!(body, "NOT READY: starting\n");
        health.set("datapath", Ok(()));
        let (status, body) = ask(address, &get("/readyz")).await;
        assert_eq!(
            (status.as_str(), body.as_str()),
            ("HTTP/1.1 200 OK", "ok datapath\n")
        );

        let (status, body) = ask(address, &get("/metrics")).await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body.contains("# TYPE ipam_"), "an exposition: {body}");

        let (status, _) = ask(address, &get("/nothing")).await;
        assert_eq!(status, "HTTP/1.1 404 Not Found");
        let post =
            "POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        let (status, _) = ask(address, post).await;
        assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
        let (status, _) = ask(address, "this is not HTTP\r\n\r\n").await;
        assert_eq!(status, "HTTP/1.1 400 Bad Request");
    }
}
