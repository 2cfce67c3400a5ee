//! Log setup: `tracing` to stderr, text or JSON lines.
//!
//! Format and filter come from `[log]` (where `$GLIDEFS_LOG_FORMAT` and `$GLIDEFS_LOG` have
//! already overridden them, see [`crate::environment`]). A bad filter falls back to `info`
//! with a warning instead of failing the daemon. Errors are logged with their whole source
//! chain, [`glidefs_model::log::chain`].

use glidefs_model::log::chain;
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSection};

/// Installs the global subscriber (once; later calls do nothing).
pub fn init(cfg: &LogSection) {
    let format = cfg.format;
    let directives = cfg.filter.clone();
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
        tracing::warn!(filter = %directives, error = %chain(&e), "bad log filter, using `info`");
    }
}
