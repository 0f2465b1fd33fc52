//! Logs: the global tracing subscriber, set up once from the flags before anything else runs.

use std::str::FromStr;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{LevelFilter, ParseError};

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[allow(missing_docs)] // clap would print a variant's doc comment in --help; the flag's says it
pub enum LogFormat {
    Text,
    Json,
}

/// Why a `--log-level` (or `RUST_LOG`) is refused at start-up, instead of silently logging at
/// another level than asked for.
#[derive(Debug, thiserror::Error)]
pub enum LogLevelError {
    /// A directive whose level is not one of tracing's. A bare word is a level; a target is
    /// written `TARGET=LEVEL` (EnvFilter would read a bare `verbose` as the target `verbose`,
    /// and log nothing else).
    #[error(
        "unknown log level {level:?} in {directive:?}: want trace, debug, info, warn, error or off, \
         alone or as TARGET=LEVEL (e.g. \"info,statefulset_scaledown_controller=debug\")"
    )]
    UnknownLevel {
        /// The directive it is in.
        directive: String,
        /// The word that is not a level.
        level: String,
    },
    /// Not in EnvFilter's syntax at all.
    #[error("log filter {spec:?} does not parse: {source}")]
    Syntax {
        /// The filter as given.
        spec: String,
        /// EnvFilter's error.
        #[source]
        source: ParseError,
    },
}

/// The filter of `spec` (EnvFilter's syntax, every directive naming a level).
pub fn log_filter(spec: &str) -> Result<EnvFilter, LogLevelError> {
    for directive in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        // `target[span{field=value}]` without `=LEVEL` means every level of that span: no level.
        if directive.ends_with(']') || directive.ends_with('}') {
            continue;
        }
        let level = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
        if LevelFilter::from_str(level).is_err() || level.is_empty() {
            return Err(LogLevelError::UnknownLevel {
                directive: directive.to_string(),
                level: level.to_string(),
            });
        }
    }
    EnvFilter::try_new(spec).map_err(|source| LogLevelError::Syntax {
        spec: spec.to_string(),
        source,
    })
}

/// clap's parser of `--log-level`: `spec` if [`log_filter`] accepts it.
pub fn parse_log_level(spec: &str) -> Result<String, LogLevelError> {
    log_filter(spec).map(|_| spec.to_string())
}

/// Installs the global tracing subscriber from `--log-level` and `--log-format`.
pub fn init_logging(level: &str, format: LogFormat) -> Result<(), LogLevelError> {
    let filter = log_filter(level)?;
    // Colours only on a terminal, and never with NO_COLOR set (no escape codes in log files).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Args;
    use clap::Parser;

    /// Levels, targets with levels and span filters start; an unknown level (alone or after a
    /// target) and a bare target are start-up errors that say what is wanted.
    #[test]
    fn an_unknown_log_level_is_a_start_up_error() {
        for good in [
            "info",
            "DEBUG",
            "off",
            "info,statefulset_scaledown_controller=debug",
            "warn,kube_runtime=trace,",
            "info,kube[watch{resource=pods}]",
        ] {
            let args = Args::try_parse_from(["c", "--log-level", good]);
            assert_eq!(args.map(|a| a.log_level).ok().as_deref(), Some(good));
        }
        for bad in ["verbose", "infoo", "info,kube=loud", "kube", "info,kube="] {
            let err = Args::try_parse_from(["c", "--log-level", bad]).expect_err(bad);
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
            let text = err.to_string();
            assert!(text.contains("unknown log level"), "{bad}: {text}");
            assert!(text.contains("--log-level"), "{bad}: {text}");
        }
        for syntax in ["info,kube[{=debug", "info,[{"] {
            assert!(log_filter(syntax).is_err(), "{syntax}");
        }
    }
}
