//! Polling with a deadline that reports what was last seen when it gives up.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// One observation of a condition being waited for.
pub enum Check<T> {
    /// The condition holds; stop waiting.
    Done(T),
    /// Not yet; the string says what was seen, for the timeout message.
    Waiting(String),
}

/// Polls `check` every 250 ms until it is done or `timeout` passes; the error names what
/// was awaited and what was last seen.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Check<T>>,
{
    let started = Instant::now();
    loop {
        let last_seen = match check().await {
            Check::Done(value) => return Ok(value),
            Check::Waiting(seen) => seen,
        };
        if started.elapsed() >= timeout {
            bail!("timed out after {timeout:?} waiting for {what}; last seen: {last_seen}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_value_once_done() {
        let mut calls = 0;
        let value = wait_for("three calls", Duration::from_secs(5), || {
            calls += 1;
            let n = calls;
            async move {
                if n >= 3 {
                    Check::Done(n)
                } else {
                    Check::Waiting(format!("call {n}"))
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test]
    async fn timeout_reports_the_last_observation() {
        let error = wait_for::<(), _, _>("never", Duration::from_millis(300), || async {
            Check::Waiting("still 2/3 ready".into())
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(error.contains("waiting for never"), "{error}");
        assert!(error.contains("still 2/3 ready"), "{error}");
    }
}
