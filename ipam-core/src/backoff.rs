//! Exponential backoff with jitter, for conditions that time can fix (an interface that does not
//! exist yet, a pool without a block yet): the daemon waits and says what it waits for, and never
//! exits over them.

use std::time::Duration;

use rand::Rng as _;

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    factor: f64,
    jitter: f64,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    /// 500 ms, growing by 1.5 per attempt, ±10 % jitter, capped at `cap`.
    pub fn new(cap: Duration) -> Self {
        Self::with(Duration::from_millis(500), 1.5, 0.1, cap)
    }

    pub fn with(initial: Duration, factor: f64, jitter: f64, cap: Duration) -> Self {
        Self {
            initial,
            factor,
            jitter,
            cap,
            next: initial,
        }
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = self.next.mul_f64(self.factor).min(self.cap);
        // Jitter only spreads the retries of many nodes; any uniform source will do.
        let unit: f64 = rand::rng().random();
        let scale = 1.0 + self.jitter * (2.0 * unit - 1.0);
        base.mul_f64(scale).min(self.cap)
    }

    /// Starts again from the initial delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_by_factor_within_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_secs(5));
        let mut expected = 0.5;
        for _ in 0..20 {
            let d = b.next_delay().as_secs_f64();
            let want = f64::min(expected, 5.0);
            assert!(
                d >= want * 0.9 - 1e-9 && d <= f64::min(want * 1.1, 5.0) + 1e-9,
                "{d} vs {want}"
            );
            expected *= 1.5;
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(550));
    }
}
