//! The library's error type. Variants say what failed and on which object; the binary's
//! edge wraps them in `anyhow` for printing.

use std::time::Duration;

/// Errors Bulkhead's library returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kubeconfig could not be read or did not contain a usable context.
    #[error("cannot load kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// No kubeconfig was given and none could be inferred.
    #[error("cannot find cluster credentials (pass --kubeconfig or set KUBECONFIG): {0}")]
    InferConfig(#[source] kube::config::InferConfigError),

    /// A kube client could not be built from a valid configuration.
    #[error("cannot build a Kubernetes client for {what}: {source}")]
    Client {
        what: String,
        #[source]
        source: kube::Error,
    },

    /// An API request failed.
    #[error("{action} failed: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },

    /// A CRD the process needs is not installed or not Established in time.
    #[error(
        "CustomResourceDefinition {name} is not established after {waited:?}; install the CRDs with `bulkhead crd | kubectl apply -f -`"
    )]
    CrdNotEstablished { name: String, waited: Duration },

    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },

    /// A command-line option has a value the process cannot work with.
    #[error("invalid option {option}: {reason}")]
    InvalidOption { option: String, reason: String },

    /// Any other I/O failure, with what was being done.
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },
}

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an API error with the action that failed.
    pub fn api(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Api {
            action: action.into(),
            source,
        }
    }
}

/// How an API error should be handled, the way a Kubernetes user expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiErrorKind {
    /// 404: the object (or its namespace) is gone.
    NotFound,
    /// 409: someone else changed the object; re-read and retry at once.
    Conflict,
    /// 400/422: the object we sent is invalid; report it and wait for a change.
    Invalid,
    /// 401/403: our credentials cannot do this.
    Forbidden,
    /// Timeouts, 429, 5xx and connection failures: back off and retry.
    Transient,
}

/// Classifies a kube error.
pub fn classify(error: &kube::Error) -> ApiErrorKind {
    match error {
        kube::Error::Api(status) => match status.code {
            404 => ApiErrorKind::NotFound,
            409 => ApiErrorKind::Conflict,
            400 | 422 => ApiErrorKind::Invalid,
            401 | 403 => ApiErrorKind::Forbidden,
            _ => ApiErrorKind::Transient,
        },
        _ => ApiErrorKind::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        }))
    }

    #[test]
    fn classifies_by_status_code() {
        assert_eq!(classify(&api_error(404)), ApiErrorKind::NotFound);
        assert_eq!(classify(&api_error(409)), ApiErrorKind::Conflict);
        assert_eq!(classify(&api_error(422)), ApiErrorKind::Invalid);
        assert_eq!(classify(&api_error(400)), ApiErrorKind::Invalid);
        assert_eq!(classify(&api_error(403)), ApiErrorKind::Forbidden);
        assert_eq!(classify(&api_error(500)), ApiErrorKind::Transient);
        assert_eq!(classify(&api_error(429)), ApiErrorKind::Transient);
    }
}
