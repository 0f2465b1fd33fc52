//! What can be wrong with a template, as short messages that fit an Event and a log line.

use crate::reason::Reason;

/// Everything that can be wrong with a template. Each variant is one Warning Event reason. Every
/// message is short (user text in it is clipped), so it fits an Event and a log line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// Neither JSON nor YAML; the parser's words.
    #[error("the annotation is neither JSON nor YAML: {0}")]
    Unparseable(String),
    /// Not a pod; why.
    #[error("the template is not a pod: {0}")]
    NotAPod(String),
    /// The policy, quoted and clipped.
    #[error("restartPolicy {0} is not allowed: use OnFailure (the default) or Never")]
    RestartPolicy(String),
    /// The template's labels would be selected by the StatefulSet's selector.
    #[error(
        "the cleanup pod's labels {labels} match the StatefulSet's selector, so the StatefulSet controller would adopt and delete it"
    )]
    SelectorOverlap {
        /// The template's labels, clipped.
        labels: String,
    },
    /// The volume name, quoted and clipped.
    #[error(
        "volume {0} has the name of a claim template but is not a persistentVolumeClaim volume"
    )]
    VolumeClash(String),
    /// A field a cleanup pod must not set.
    #[error("field {0} may not be set in a cleanup pod template")]
    ForbiddenField(&'static str),
    /// The annotation, or the pod rendered from it, is over a size limit.
    #[error("{what} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The YAML is over one of the parser's limits (named in the message).
    #[error("the template is over a YAML parser limit: {0}")]
    OverBudget(String),
}

impl TemplateError {
    /// The Event reason for this problem.
    pub fn reason(&self) -> Reason {
        match self {
            TemplateError::Unparseable(_) | TemplateError::NotAPod(_) => {
                Reason::CleanupTemplateInvalid
            }
            TemplateError::RestartPolicy(_) => Reason::CleanupTemplateRestartPolicy,
            TemplateError::SelectorOverlap { .. } => Reason::CleanupTemplateSelectorOverlap,
            TemplateError::VolumeClash(_) => Reason::CleanupTemplateVolumeClash,
            TemplateError::ForbiddenField(_) => Reason::CleanupTemplateForbiddenField,
            TemplateError::TooLarge { .. } | TemplateError::OverBudget(_) => {
                Reason::CleanupTemplateTooLarge
            }
        }
    }
}

/// Bytes of user or parser text kept in an error message.
const MAX_SHOWN: usize = 200;

/// `text`, cut to at most [`MAX_SHOWN`] bytes at a character boundary.
pub(crate) fn clip(text: &str) -> String {
    if text.len() <= MAX_SHOWN {
        return text.to_string();
    }
    let mut end = MAX_SHOWN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `text` quoted and escaped as Rust's Debug does, then clipped.
pub(crate) fn quoted(text: &str) -> String {
    clip(&format!("{text:?}"))
}
