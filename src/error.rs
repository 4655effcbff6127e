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
