//! The agent's client of an instance manager's API (`GET /status`, `PUT /desired`): one
//! HTTP/1.1 request per connection, bounded by a timeout, so a silent pod costs a round
//! nothing but the timeout.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use crate::api::instance::{Desired, InstanceStatus, TOKEN_HEADER};

/// Largest answer read from an instance.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

async fn request(
    address: SocketAddr,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
) -> Result<(StatusCode, Bytes)> {
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .with_context(|| format!("connecting to {address}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake")?;
    let connection = tokio::spawn(connection);
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, address.to_string());
    if let Some(token) = token {
        builder = builder.header(TOKEN_HEADER, format!("Bearer {token}"));
    }
    if body.is_some() {
        builder = builder.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    let request = builder.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    let response = sender.send_request(request).await;
    let result = async {
        let response = response.context("sending the request")?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?
            .to_bytes();
        Ok((status, body))
    }
    .await;
    connection.abort();
    result
}

/// The instance's status; an error when it does not answer within `timeout`.
pub async fn status(address: SocketAddr, timeout: Duration) -> Result<InstanceStatus> {
    let (code, body) = tokio::time::timeout(
        timeout,
        request(address, Method::GET, "/status", None, None),
    )
    .await
    .with_context(|| format!("{address} did not answer within {timeout:?}"))??;
    if code != StatusCode::OK {
        bail!(
            "{address} answered {code}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    serde_json::from_slice(&body).with_context(|| format!("{address}'s status"))
}

/// Tells the instance its role. A refusal (a lower term than it has seen: 409, a wrong
/// token: 401) is an error naming the instance's answer.
pub async fn tell(
    address: SocketAddr,
    token: &str,
    desired: &Desired,
    timeout: Duration,
) -> Result<InstanceStatus> {
    let body = serde_json::to_vec(desired)?;
    let (code, answer) = tokio::time::timeout(
        timeout,
        request(address, Method::PUT, "/desired", Some(token), Some(body)),
    )
    .await
    .with_context(|| format!("{address} did not answer within {timeout:?}"))??;
    if code != StatusCode::OK {
        bail!(
            "{address} refused the role ({code}): {}",
            String::from_utf8_lossy(&answer).trim()
        );
    }
    serde_json::from_slice(&answer).with_context(|| format!("{address}'s answer"))
}
