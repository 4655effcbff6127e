//! A rollout wave's analysis: the policy's PromQL queries, asked of Prometheus's HTTP API
//! (`GET /api/v1/query`), and judged by their success conditions. One call is one
//! measurement ([`measure`]); the rollout decision (`rollout.rs`) counts them.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use crate::api::rollout::{AnalysisMeasurement, MetricResult, RolloutAnalysis, SuccessCondition};

/// The longest one query may take; past it the metric fails this measurement.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read.
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// The roots an https Prometheus or alert webhook is verified against: the system's
/// (or the bundle `SSL_CERT_FILE` names, for a private CA), read once.
fn system_roots() -> Arc<rustls::RootCertStore> {
    static ROOTS: OnceLock<Arc<rustls::RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for error in &found.errors {
                tracing::warn!(%error, "reading the system's CA certificates");
            }
            let mut roots = rustls::RootCertStore::empty();
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            tracing::debug!(
                added,
                ignored,
                "CA certificates for https analysis and alerts"
            );
            Arc::new(roots)
        })
        .clone()
}

/// An http and https client verifying servers against `roots`.
fn client<B>(roots: Arc<rustls::RootCertStore>) -> Client<HttpsConnector<HttpConnector>, B>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
{
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default protocol versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Why an address cannot be used, if it cannot: http:// or https:// only.
fn unusable(address: &str) -> Option<String> {
    (!address.starts_with("http://") && !address.starts_with("https://"))
        .then(|| format!("`{address}` is not an http:// or https:// address"))
}

/// A query with its placeholders filled: `{{clusters}}` becomes a regular expression
/// matching exactly the wave's clusters, `{{revision}}` the revision.
pub fn fill(query: &str, clusters: &[&str], revision: i64) -> String {
    let alternatives: Vec<String> = clusters.iter().map(|c| c.replace('.', "\\\\.")).collect();
    query
        .replace("{{clusters}}", &alternatives.join("|"))
        .replace("{{revision}}", &revision.to_string())
}

/// The samples of a Prometheus query answer (vector or scalar), or why there are none.
pub fn samples(answer: &Value) -> Result<Vec<f64>, String> {
    if answer["status"] != "success" {
        return Err(format!(
            "Prometheus answered {}: {}",
            answer["errorType"].as_str().unwrap_or("an error"),
            answer["error"].as_str().unwrap_or("no message")
        ));
    }
    let value = |pair: &Value| -> Result<f64, String> {
        pair[1]
            .as_str()
            .ok_or_else(|| "a sample without a value".to_string())?
            .parse::<f64>()
            .map_err(|_| format!("a sample value that is not a number: {}", pair[1]))
    };
    let data = &answer["data"];
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|sample| value(&sample["value"]))
            .collect(),
        Some("scalar") => Ok(vec![value(&data["result"])?]),
        other => Err(format!(
            "the query gives a {}, not an instant vector or a scalar",
            other.unwrap_or("nothing")
        )),
    }
}

/// Judges one metric's samples: every one must meet the condition, and there must be one.
pub fn judge(name: &str, condition: &str, answer: Result<Vec<f64>, String>) -> MetricResult {
    let failed = |values: Vec<f64>, message: String| MetricResult {
        name: name.to_string(),
        values,
        passed: false,
        message: Some(message),
    };
    let condition = match SuccessCondition::parse(condition) {
        Ok(condition) => condition,
        Err(error) => return failed(vec![], format!("successCondition {error}")),
    };
    match answer {
        Err(error) => failed(vec![], error),
        Ok(values) if values.is_empty() => failed(vec![], "no data".into()),
        // JSON has no NaN or infinity (the binding could not hold them): they are left
        // out of the values, and fail the measurement, as no data does.
        Ok(values) if values.iter().any(|v| !v.is_finite()) => failed(
            values.into_iter().filter(|v| v.is_finite()).collect(),
            "a sample is NaN or infinite (a ratio of rates that are zero: no traffic in the window yet?)".into(),
        ),
        Ok(values) => {
            let passed = values.iter().all(|v| condition.holds(*v));
            MetricResult {
                name: name.to_string(),
                message: (!passed).then(|| {
                    format!(
                        "not {condition_text}",
                        condition_text = condition_text(&condition)
                    )
                }),
                values,
                passed,
            }
        }
    }
}

fn condition_text(condition: &SuccessCondition) -> String {
    use crate::api::rollout::Comparison::*;
    let op = match condition.op {
        Less => "<",
        LessOrEqual => "<=",
        Greater => ">",
        GreaterOrEqual => ">=",
        Equal => "==",
        NotEqual => "!=",
    };
    format!("result {op} {}", condition.threshold)
}

/// Takes one measurement: every metric's query, at once.
pub async fn measure(
    analysis: &RolloutAnalysis,
    clusters: &[&str],
    revision: i64,
    now: jiff::Timestamp,
) -> AnalysisMeasurement {
    measure_with(analysis, clusters, revision, now, system_roots()).await
}

async fn measure_with(
    analysis: &RolloutAnalysis,
    clusters: &[&str],
    revision: i64,
    now: jiff::Timestamp,
    roots: Arc<rustls::RootCertStore>,
) -> AnalysisMeasurement {
    let client = client(roots);
    let queries = analysis.metrics.iter().map(|metric| {
        let client = client.clone();
        let query = fill(&metric.query, clusters, revision);
        async move {
            let answer = ask(&client, &analysis.prometheus, &query).await;
            judge(&metric.name, &metric.success_condition, answer)
        }
    });
    let metrics = futures::future::join_all(queries).await;
    AnalysisMeasurement {
        at: Some(Time(now)),
        passed: metrics.iter().all(|m| m.passed),
        metrics,
    }
}

async fn ask(
    client: &Client<HttpsConnector<HttpConnector>, Empty<bytes::Bytes>>,
    base: &str,
    query: &str,
) -> Result<Vec<f64>, String> {
    if let Some(why) = unusable(base) {
        return Err(format!("analysis.prometheus: {why}"));
    }
    let encoded: String = url_encode(query);
    let uri = format!(
        "{}/api/v1/query?query={encoded}",
        base.trim_end_matches('/')
    );
    let request = http::Request::get(&uri)
        .body(Empty::new())
        .map_err(|e| format!("bad address `{uri}`: {e}"))?;
    let response = tokio::time::timeout(QUERY_TIMEOUT, client.request(request))
        .await
        .map_err(|_| format!("Prometheus did not answer within {QUERY_TIMEOUT:?}"))?
        .map_err(|e| format!("cannot reach Prometheus at {base}: {}", chain(&e)))?;
    let status = response.status();
    let body = tokio::time::timeout(
        QUERY_TIMEOUT,
        http_body_util::Limited::new(response.into_body(), MAX_ANSWER).collect(),
    )
    .await
    .map_err(|_| "Prometheus's answer did not arrive in time".to_string())?
    .map_err(|e| format!("cannot read Prometheus's answer: {e}"))?
    .to_bytes();
    let answer: Value = serde_json::from_slice(&body)
        .map_err(|_| format!("Prometheus answered {status} with no JSON"))?;
    samples(&answer)
}

/// POSTs a rollout alert (JSON) to the policy's `alertWebhook`; a failure is logged, the
/// Event on the template is the record.
pub async fn alert(url: String, alert: Value) {
    if let Some(why) = unusable(&url) {
        tracing::warn!(%url, "alertWebhook: {why}; the alert is only an Event");
        return;
    }
    let client = client(system_roots());
    let request = match http::Request::post(&url)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            alert.to_string(),
        ))) {
        Ok(request) => request,
        Err(error) => {
            tracing::warn!(%url, %error, "alertWebhook: not a usable address");
            return;
        }
    };
    match tokio::time::timeout(QUERY_TIMEOUT, client.request(request)).await {
        Ok(Ok(response)) if response.status().is_success() => {}
        Ok(Ok(response)) => {
            tracing::warn!(%url, status = %response.status(), "alertWebhook refused the alert")
        }
        Ok(Err(error)) => tracing::warn!(%url, error = chain(&error), "alertWebhook unreachable"),
        Err(_) => tracing::warn!(%url, "alertWebhook did not answer in time"),
    }
}

/// An error with its sources ("client error (Connect): invalid peer certificate:
/// UnknownIssuer"): the connector's own message alone does not say why TLS failed.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Percent-encodes a query for a URL's query string.
pub fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::rollout::AnalysisMetric;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A Prometheus stand-in over real TLS (a certificate from a fresh CA for 127.0.0.1),
    /// answering every query with one sample of `value`. Returns its address and the CA.
    async fn https_prometheus(value: &str) -> (String, String) {
        use crate::webhook::tls;
        let authority = tls::CertificateAuthority::new("prometheus-ca").unwrap();
        let issued = authority.issue(&["127.0.0.1".into()]).unwrap();
        let store = tls::CertificateStore::new(
            tls::certified_key(&issued.cert_pem, &issued.key_pem).unwrap(),
        );
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls::server_config(store)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("https://{}", listener.local_addr().unwrap());
        let body = json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"cluster": "east"}, "value": [1.0, value]}]}})
        .to_string();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, body) = (acceptor.clone(), body.clone());
                tokio::spawn(async move {
                    let Ok(mut stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut request = vec![0; 4096];
                    let _ = stream.read(&mut request).await;
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        (address, issued.ca_pem)
    }

    #[tokio::test]
    async fn an_https_prometheus_is_asked_when_its_ca_is_trusted_and_refused_when_not() {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let (address, ca_pem) = https_prometheus("0.01").await;
        let analysis = RolloutAnalysis {
            prometheus: address.clone(),
            metrics: vec![AnalysisMetric {
                name: "errors".into(),
                query: "errors{cluster=~\"{{clusters}}\"}".into(),
                success_condition: "result < 0.05".into(),
            }],
            ..Default::default()
        };
        let now = jiff::Timestamp::now();
        let mut trusted = rustls::RootCertStore::empty();
        trusted
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let measured = measure_with(&analysis, &["east"], 2, now, Arc::new(trusted)).await;
        assert!(measured.passed, "{measured:?}");
        assert_eq!(measured.metrics[0].values, vec![0.01]);

        let untrusted = rustls::RootCertStore::empty();
        let refused = measure_with(&analysis, &["east"], 2, now, Arc::new(untrusted)).await;
        assert!(!refused.passed);
        let message = refused.metrics[0].message.clone().unwrap_or_default();
        assert!(
            message.contains(&address) && message.contains("UnknownIssuer"),
            "names the server and why TLS failed: {message}"
        );

        let mut other = analysis.clone();
        other.prometheus = "prometheus:9090".into();
        let measured = measure_with(&other, &["east"], 2, now, system_roots()).await;
        assert!(
            measured.metrics[0]
                .message
                .as_deref()
                .is_some_and(|m| m.contains("not an http:// or https:// address")),
            "{measured:?}"
        );
    }

    #[test]
    fn queries_name_the_waves_clusters_and_revision() {
        assert_eq!(
            fill(
                "sum(rate(errors{cluster=~\"{{clusters}}\",revision=\"{{revision}}\"}[1m]))",
                &["east", "west"],
                4
            ),
            "sum(rate(errors{cluster=~\"east|west\",revision=\"4\"}[1m]))"
        );
        assert_eq!(url_encode("a b{c=\"d\"}"), "a%20b%7Bc%3D%22d%22%7D");
    }

    #[test]
    fn answers_are_judged_sample_by_sample_and_no_data_fails() {
        let vector = json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"cluster": "east"}, "value": [1.0, "0.01"]},
            {"metric": {"cluster": "west"}, "value": [1.0, "0.2"]}
        ]}});
        assert_eq!(samples(&vector).unwrap(), vec![0.01, 0.2]);
        let result = judge("errors", "result < 0.05", samples(&vector));
        assert!(!result.passed);
        assert_eq!(result.message.as_deref(), Some("not result < 0.05"));
        assert!(judge("errors", "result < 0.5", samples(&vector)).passed);
        let scalar =
            json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "NaN"]}});
        let nan = judge("x", "result >= 0", samples(&scalar));
        assert!(
            !nan.passed && nan.values.is_empty(),
            "NaN fails, and is not a value"
        );
        assert!(
            serde_json::to_value(&nan).unwrap().get("values").is_none(),
            "nothing JSON cannot hold"
        );
        let empty = json!({"status": "success", "data": {"resultType": "vector", "result": []}});
        assert_eq!(
            judge("x", "result < 1", samples(&empty)).message.as_deref(),
            Some("no data")
        );
        let error = json!({"status": "error", "errorType": "bad_data", "error": "parse error"});
        assert!(
            judge("x", "result < 1", samples(&error))
                .message
                .unwrap()
                .contains("parse error")
        );
        assert!(
            judge("x", "fast", Ok(vec![1.0]))
                .message
                .unwrap()
                .contains("successCondition")
        );
    }
}
