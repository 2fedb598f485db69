//! The daemon's log: tracing's formatter on stderr, in colour only where a person reads it.
//! A container's log, a file or a pipe gets plain text; `NO_COLOR` (no-color.org) turns colour
//! off on a terminal too.

use std::{ffi::OsStr, io::IsTerminal as _};

/// Starts logging to stderr with `filter` (RUST_LOG syntax).
pub fn init(filter: &str) -> Result<(), tracing_subscriber::filter::ParseError> {
    let colour = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(filter)?)
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .init();
    Ok(())
}

/// Whether to colour: on a terminal, unless `NO_COLOR` is set to anything but the empty string.
fn colour(terminal: bool, no_color: Option<&OsStr>) -> bool {
    terminal && no_color.is_none_or(OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        assert!(colour(true, None));
        assert!(
            colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR does not count"
        );
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None), "a pipe or a file gets no escapes");
        assert!(!colour(false, Some(OsStr::new("1"))));
    }
}
