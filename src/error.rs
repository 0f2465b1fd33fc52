//! The one error type of the library, with a bounded category for metrics and logs.

/// Why a reconcile (or the startup) failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed; `action` says which (e.g. "delete claim").
    #[error("{action} {name}: {source}")]
    Kube {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The API server refused the rendered cleanup pod (a template problem it found and we did not).
    #[error("the API server rejected cleanup pod {pod}: {message}")]
    PodRejected { pod: String, message: String },
    /// A watch cache has not synced yet; decisions wait for it.
    #[error("the {0} cache is not ready")]
    CacheNotReady(&'static str),
    /// Building a request body failed (a bug, not bad input).
    #[error("could not encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// This process lost the leader Lease (or could not renew it in time) and must stop.
    #[error("lost leadership")]
    LeadershipLost,
    /// A write was about to be made by a process that is not (or no longer) the leader.
    #[error("not the leader")]
    NotLeader,
    /// The controller could not be configured (flags, kubeconfig, namespace).
    #[error("configuration: {0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn kube(
        action: &'static str,
        name: impl Into<String>,
    ) -> impl FnOnce(kube::Error) -> Error {
        let name = name.into();
        move |source| Error::Kube {
            action,
            name,
            source,
        }
    }

    /// A small, fixed set of names: safe as a metric label value.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } => match source {
                kube::Error::Api(status) => match status.code {
                    401 => "unauthorized",
                    403 => "forbidden",
                    404 => "not_found",
                    409 => "conflict",
                    400 | 422 => "invalid",
                    429 => "throttled",
                    500..=599 => "server_error",
                    _ => "api_error",
                },
                _ => "transport",
            },
            Error::PodRejected { .. } => "pod_rejected",
            Error::CacheNotReady(_) => "cache_not_ready",
            Error::Encode { .. } => "internal",
            Error::Config(_) => "config",
            Error::LeadershipLost | Error::NotLeader => "not_leader",
        }
    }
}

/// The HTTP status of an API error, if it is one.
pub(crate) fn status_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> Error {
        let status = kube::core::Status {
            code,
            ..Default::default()
        };
        Error::kube("delete claim", "data-web-2")(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn categories_are_bounded_names() {
        let cases = [
            (api(403), "forbidden"),
            (api(409), "conflict"),
            (api(422), "invalid"),
            (api(503), "server_error"),
            (api(418), "api_error"),
            (
                Error::PodRejected {
                    pod: "web-2".into(),
                    message: "bad".into(),
                },
                "pod_rejected",
            ),
            (Error::NotLeader, "not_leader"),
            (Error::CacheNotReady("pod"), "cache_not_ready"),
        ];
        for (err, want) in cases {
            assert_eq!(err.category(), want, "{err}");
        }
        assert!(
            api(409)
                .to_string()
                .starts_with("delete claim data-web-2: ")
        );
    }
}
