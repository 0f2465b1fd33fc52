//! The one error type of the library. Each error has a `Category`: a small closed set that names
//! metric label values and log fields, decided by type, never by matching message strings.

/// Why a reconcile (or the startup) failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed; `action` says which (e.g. "delete claim").
    #[error("{action}{}: {source}", named(.name))]
    Kube {
        /// What was being done (e.g. "delete claim").
        action: &'static str,
        /// The object it was done to; empty for the object of the pass itself, which the pass
        /// runner's log line and Event name already ([`Error::kube_own`]).
        name: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// A watch cache has not synced yet; decisions wait for it.
    #[error("the {0} cache is not ready")]
    CacheNotReady(&'static str),
    /// Building a request body failed (a bug, not bad input).
    #[error("could not encode {what}: {source}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// Building a request failed (a bug, not bad input).
    #[error("could not build {what}: {source}")]
    Request {
        /// What was being built.
        what: &'static str,
        /// kube's error.
        #[source]
        source: kube::core::request::Error,
    },
    /// The record of a new cleanup pod on the StatefulSet was refused (its test ops failed: the set
    /// changed after the read) every time it was tried; `answer` is the API server's last answer.
    #[error("statefulset {set} kept changing while a cleanup pod was recorded ({answer})")]
    Contended {
        /// The StatefulSet.
        set: String,
        /// The API server's last answer.
        answer: String,
    },
    /// The record of a new cleanup pod on the StatefulSet failed otherwise (refused by admission
    /// or RBAC, the API server unreachable): the pod is not known to be recorded.
    #[error("record cleanup pod on statefulset {set}: {source}")]
    Unrecorded {
        /// The StatefulSet.
        set: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// This process lost the leader Lease (or could not renew it in time) and must stop.
    #[error("lost leadership")]
    LeadershipLost,
    /// A write was about to be made by a process that is not (or no longer) the leader.
    #[error("not the leader")]
    NotLeader,
    /// The leader election Lease could not be read, created or kept.
    #[error("leader election Lease {lease}: {source}")]
    Election {
        /// The Lease, `namespace/name`.
        lease: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// A task of the process ended when it should have kept running.
    #[error("{0} stopped unexpectedly")]
    Stopped(&'static str),
    /// A task of the process panicked or was cancelled.
    #[error("{task}: {source}")]
    Joined {
        /// The task's name.
        task: &'static str,
        /// Why it ended.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A server of the process (metrics, probes) failed while serving.
    #[error("{what} server: {source}")]
    Serve {
        /// Which server (`metrics`, `probes`).
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The controller could not be configured (flags, kubeconfig, namespace).
    #[error("configuration: {0}")]
    Config(String),
    /// The error of a read shared between callers (`crate::coalesce`): each of them gets it.
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
}

/// ` name`, or nothing for no name.
fn named(name: &str) -> String {
    if name.is_empty() {
        String::new()
    } else {
        format!(" {name}")
    }
}

/// A result whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A write the fence (`crate::fence`) did not send, because this process may not write now (not
/// the leader, or its renew deadline passed). kube hands it on as `kube::Error::Service`; its
/// category is `not_leader`.
#[derive(Debug, thiserror::Error)]
#[error("{method} {path} not sent: this process is not the leader, or its renew deadline passed")]
pub struct Fenced {
    /// The request's HTTP method.
    pub method: String,
    /// The request's path.
    pub path: String,
}

/// HTTP status codes the controller gives a meaning to.
pub mod code {
    /// 400: the request is malformed or refused as such.
    pub const BAD_REQUEST: u16 = 400;
    /// 401: no valid credentials.
    pub const UNAUTHORIZED: u16 = 401;
    /// 403: RBAC or admission said no.
    pub const FORBIDDEN: u16 = 403;
    /// 404: the object is not there.
    pub const NOT_FOUND: u16 = 404;
    /// 409: a conflict (exists already, or a precondition failed).
    pub const CONFLICT: u16 = 409;
    /// 410: the watch's resourceVersion is too old.
    pub const GONE: u16 = 410;
    /// 413: the request is too large.
    pub const TOO_LARGE: u16 = 413;
    /// 422: invalid, or a JSON patch test op failed.
    pub const INVALID: u16 = 422;
    /// 429: throttled (API priority and fairness).
    pub const THROTTLED: u16 = 429;
    /// 500: the API server failed (also etcd's "request too large").
    pub const INTERNAL: u16 = 500;

    /// Whether a create answered `status` means "this object, as it is, is refused": sending it
    /// again at once would be refused again (admission, quota, validation, size; etcd's "request
    /// too large" comes as 500). Other 5xx (unavailable, timeouts) are transient instead.
    pub fn refuses_create(status: u16) -> bool {
        matches!(
            status,
            BAD_REQUEST | FORBIDDEN | TOO_LARGE | INVALID | INTERNAL
        )
    }
}

/// What kind of failure an error is: a bounded set, safe as a metric label value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    /// 401 from the API server.
    Unauthorized,
    /// 403 from the API server.
    Forbidden,
    /// 404 from the API server.
    NotFound,
    /// 409 from the API server.
    Conflict,
    /// 422 from the API server.
    Invalid,
    /// 429 from the API server.
    Throttled,
    /// 5xx from the API server.
    ServerError,
    /// Any other status from the API server.
    ApiError,
    /// No answer: the API server could not be reached, or the connection broke.
    Transport,
    /// A cache has not synced yet.
    CacheNotReady,
    /// A record lost every race (see [`Error::Contended`]).
    Contended,
    /// A bug: a request could not be built or encoded.
    Internal,
    /// A write not sent: this process is not the leader (see [`Fenced`]).
    NotLeader,
    /// A task of the process stopped, panicked or was cancelled.
    Task,
    /// The configuration (flags, kubeconfig) was refused.
    Config,
}

impl Category {
    /// Every category, for declaring each label value before its first occurrence.
    pub const ALL: [Category; 15] = [
        Category::Unauthorized,
        Category::Forbidden,
        Category::NotFound,
        Category::Conflict,
        Category::Invalid,
        Category::Throttled,
        Category::ServerError,
        Category::ApiError,
        Category::Transport,
        Category::CacheNotReady,
        Category::Contended,
        Category::Internal,
        Category::NotLeader,
        Category::Task,
        Category::Config,
    ];

    /// The metric label value and log field of this category.
    pub const fn as_str(self) -> &'static str {
        match self {
            Category::Unauthorized => "unauthorized",
            Category::Forbidden => "forbidden",
            Category::NotFound => "not_found",
            Category::Conflict => "conflict",
            Category::Invalid => "invalid",
            Category::Throttled => "throttled",
            Category::ServerError => "server_error",
            Category::ApiError => "api_error",
            Category::Transport => "transport",
            Category::CacheNotReady => "cache_not_ready",
            Category::Contended => "contended",
            Category::Internal => "internal",
            Category::NotLeader => "not_leader",
            Category::Task => "task",
            Category::Config => "config",
        }
    }

    fn of_api(err: &kube::Error) -> Category {
        if let kube::Error::Service(inner) = err
            && inner.is::<Fenced>()
        {
            return Category::NotLeader;
        }
        status_code(err).map_or(Category::Transport, Category::of_status)
    }

    fn of_status(status: u16) -> Category {
        match status {
            code::UNAUTHORIZED => Category::Unauthorized,
            code::FORBIDDEN => Category::Forbidden,
            code::NOT_FOUND => Category::NotFound,
            code::CONFLICT => Category::Conflict,
            code::BAD_REQUEST | code::INVALID => Category::Invalid,
            code::THROTTLED => Category::Throttled,
            500..=599 => Category::ServerError,
            _ => Category::ApiError,
        }
    }
}

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

    /// An API call on the object of the pass itself failed: the pass runner's log line
    /// (`object`) and Event (on that object) name it, so the error does not name it again.
    pub(crate) fn kube_own(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
        Error::kube(action, String::new())
    }

    /// The category of this error, by its type (and the status code of an API answer).
    pub fn category(&self) -> Category {
        match self {
            Error::Kube { source, .. } | Error::Unrecorded { source, .. } => {
                Category::of_api(source)
            }
            Error::CacheNotReady(_) => Category::CacheNotReady,
            Error::Contended { .. } => Category::Contended,
            Error::Encode { .. } | Error::Request { .. } => Category::Internal,
            Error::Election { source, .. } => Category::of_api(source),
            Error::Stopped(_) | Error::Joined { .. } | Error::Serve { .. } => Category::Task,
            Error::Config(_) => Category::Config,
            Error::LeadershipLost | Error::NotLeader => Category::NotLeader,
            Error::Shared(inner) => inner.category(),
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

/// Whether `err` is an API answer with one of these status codes.
pub(crate) fn is_status(err: &kube::Error, codes: &[u16]) -> bool {
    status_code(err).is_some_and(|c| codes.contains(&c))
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
                Error::Contended {
                    set: "web".into(),
                    answer: "422".into(),
                },
                "contended",
            ),
            (Error::NotLeader, "not_leader"),
            (Error::Stopped("the lease manager"), "task"),
            (Error::CacheNotReady("pod"), "cache_not_ready"),
        ];
        for (err, want) in cases {
            assert_eq!(err.category().as_str(), want, "{err}");
        }
        assert!(
            api(409)
                .to_string()
                .starts_with("delete claim data-web-2: ")
        );
    }
}
