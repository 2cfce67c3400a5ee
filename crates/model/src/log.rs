//! Error chains for logs: `error = %chain(&e)`.
//!
//! Display messages of this workspace's errors embed their source's text (thiserror
//! `{source}`), so the API's messages carry the detail; [`chain`] adds each further cause only
//! when the text so far does not show it already, so nothing is printed twice and causes whose
//! parent's message leaves them out (foreign errors) still appear.

use std::error::Error;
use std::fmt;

/// An error and its causes, `outer: inner: root`, for logs; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(&'a (dyn Error + 'static));

/// Shows `e` with its whole source chain (each cause once).
pub fn chain<'a>(e: &'a (dyn Error + 'static)) -> Chain<'a> {
    Chain(e)
}

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !shown.contains(&text) {
                shown.push_str(": ");
                shown.push_str(&text);
            }
            next = cause.source();
        }
        f.write_str(&shown)
    }
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        /// Embeds its source: the chain must not repeat it.
        #[error("reading `{path}` failed: {source}")]
        Embeds {
            path: &'static str,
            #[source]
            source: std::io::Error,
        },
        /// Leaves its source out: the chain adds it.
        #[error("opening the volume failed")]
        Hides(#[source] std::io::Error),
    }

    fn io(inner: &str) -> std::io::Error {
        std::io::Error::other(inner.to_string())
    }

    #[test]
    fn chain_shows_every_cause_once() {
        let e = Outer::Embeds {
            path: "/x",
            source: io("disk on fire"),
        };
        assert_eq!(chain(&e).to_string(), "reading `/x` failed: disk on fire");
        let e = Outer::Hides(io("disk on fire"));
        assert_eq!(
            chain(&e).to_string(),
            "opening the volume failed: disk on fire"
        );
    }
}
