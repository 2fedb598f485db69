//! The invariants, and what a broken one reports.

use std::{fmt, time::Duration};

/// What must hold after every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// Never two nodes answering one IP on the segment (two MACs for one IP).
    OneAnswer,
    /// Every IP with an eligible node answered by its owner alone, within
    /// [`crate::world::BOUND`] after the last disturbance.
    Answered,
}

impl Invariant {
    pub fn name(self) -> &'static str {
        match self {
            Self::OneAnswer => "one answer per IP",
            Self::Answered => "every IP answered by its owner",
        }
    }
}

/// A broken invariant: which, when, what was seen, and what happened just before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub at: Duration,
    pub what: String,
    /// The last happenings before it, oldest first.
    pub trace: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "broken at t={:.3}s: {}: {}",
            self.at.as_secs_f64(),
            self.invariant.name(),
            self.what
        )?;
        writeln!(f, "what happened before:")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}
