//! Log setup: `tracing` to stderr, text or JSON lines.
//!
//! Format: `$GLIDEFS_LOG_FORMAT` (`text`/`json`, non-empty) over `log.format`. Filter:
//! `$GLIDEFS_LOG` (non-empty) over `log.filter`. A bad filter falls back to `info` with a
//! warning instead of failing the daemon.

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSection};

/// Environment variable with `tracing` filter directives.
pub const LOG_ENV: &str = "GLIDEFS_LOG";
/// Environment variable choosing `text` or `json`.
pub const LOG_FORMAT_ENV: &str = "GLIDEFS_LOG_FORMAT";

/// Installs the global subscriber (once; later calls do nothing).
pub fn init(cfg: &LogSection) {
    let env = |k| std::env::var(k).ok().filter(|v: &String| !v.is_empty());
    let format = match env(LOG_FORMAT_ENV).as_deref() {
        Some("json") => LogFormat::Json,
        Some("text") => LogFormat::Text,
        _ => cfg.format,
    };
    let directives = env(LOG_ENV).unwrap_or_else(|| cfg.filter.clone());
    let (filter, bad) = match EnvFilter::try_new(&directives) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: journald and log files get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
    if let Some(e) = bad {
        tracing::warn!(filter = %directives, error = %e, "bad log filter, using `info`");
    }
}
