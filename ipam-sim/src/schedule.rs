//! When the world must be looked at next. The model's clock has steps of [`STEP`], but most
//! steps change nothing: the world goes from one instant where something may happen to the next
//! (a packet, a member's timer, an event, an agent's beat, tick, decision or watch delivery, the
//! operator's pass, a check), and what it does there is what a step there did when every step
//! was run (`Stepping::EveryStep` still runs them all, and `tests/seeds.rs` compares the two).
//!
//! The one part that changes with time alone and without telling is an agent's fence: the
//! verdict is judged (every step while the fence is open, every fifth while it is closed, as
//! the model always had it) on what its gossip member heard, which changes only at the
//! member's steps, and on the time, through the quiet rule and the probes that leave the
//! window. [`FenceChanges`] keeps when those may have changed it since it was last judged.

use std::{collections::VecDeque, time::Duration};

/// The model's step: every change of what a node answers happens on a step.
pub const STEP: Duration = Duration::from_millis(1);
/// A closed fence is judged on every fifth step; an open one on every step.
pub const CLOSED_FENCE_EVERY: Duration = Duration::from_millis(5);

/// How a run moves through time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stepping {
    /// From one instant where something may happen to the next.
    #[default]
    Instants,
    /// Every step, every agent at every step: the reference the instants are checked against.
    EveryStep,
}

/// The first step at or after `t`: a thing due at `t` is seen at the end of that step.
#[must_use]
pub fn step_at_or_after(t: Duration) -> Duration {
    round_up(t, STEP)
}

/// The first multiple of `grid` at or after `t` (`Duration::MAX`'s nanoseconds at most: 584
/// years).
#[must_use]
pub fn round_up(t: Duration, grid: Duration) -> Duration {
    let (t, grid) = (t.as_nanos(), grid.as_nanos());
    let up = t.div_ceil(grid) * grid;
    Duration::from_nanos(u64::try_from(up).unwrap_or(u64::MAX))
}

/// The first of the ticks `first + k * tick` at or after `t`.
#[must_use]
pub fn tick_at_or_after(first: Duration, tick: Duration, t: Duration) -> Duration {
    let Some(past) = t.checked_sub(first) else {
        return first;
    };
    first + tick * u32::try_from(past.as_nanos().div_ceil(tick.as_nanos())).unwrap_or(u32::MAX)
}

/// What may have changed an agent's fence verdict since it was last judged (see the module
/// comment). A judgement with none of them since the last one would repeat it, and the
/// fence's latch takes a repeated verdict without a change, but for its reopening, which
/// [`FenceChanges::next_change`] is given.
#[derive(Debug, Default)]
pub struct FenceChanges {
    /// The step of the member's earliest step since the last judgement (or of the agent's
    /// start: never judged).
    stepped: Option<Duration>,
    /// The steps at which probes made at the member's steps have left the fence's window, in
    /// order. A step need not have recorded a probe (which this side cannot see): one that
    /// did not only costs a judgement that finds the verdict as it was.
    ageing: VecDeque<Duration>,
    /// When it was last judged.
    judged: Option<Duration>,
}

impl FenceChanges {
    /// Those of an agent started at `now`: judged at its first judging step.
    #[must_use]
    pub fn started(now: Duration) -> Self {
        Self {
            stepped: Some(now),
            ..Self::default()
        }
    }

    /// The member stepped at `at` (the gossip's own time); a probe it recorded then counts
    /// while `at` is within `window` of the time judged.
    pub fn stepped(&mut self, at: Duration, window: Duration) {
        let step = step_at_or_after(at);
        self.stepped = Some(self.stepped.map_or(step, |s| s.min(step)));
        // Counted while `at >= now - window`: gone at the first step past `at + window`.
        let gone = round_up(at + window + Duration::from_nanos(1), STEP);
        if self.ageing.back() != Some(&gone) {
            self.ageing.push_back(gone);
        }
    }

    /// The first step after the last judgement at which the verdict may differ from it:
    /// the member stepped, a probe left the window, the silence reached `quiet_ends` (the
    /// step the quiet rule closes at, from when the member last heard another), or the latch
    /// `reopens` (a closed fence judged open long enough).
    #[must_use]
    pub fn next_change(
        &self,
        quiet_ends: Option<Duration>,
        reopens: Option<Duration>,
    ) -> Option<Duration> {
        let since_judged = |t: &Duration| self.judged.is_none_or(|j| *t > j);
        [
            self.stepped,
            self.ageing.front().copied(),
            quiet_ends.filter(since_judged),
            reopens.filter(since_judged),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The fence was judged at `now`: what changed until then is in its verdict.
    pub fn judged(&mut self, now: Duration) {
        self.stepped = None;
        while self.ageing.front().is_some_and(|t| *t <= now) {
            self.ageing.pop_front();
        }
        self.judged = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_time_is_seen_at_the_step_it_falls_in() {
        assert_eq!(step_at_or_after(ms(7)), ms(7));
        assert_eq!(step_at_or_after(Duration::from_micros(7_001)), ms(8));
        assert_eq!(round_up(ms(11), ms(5)), ms(15));
        assert_eq!(round_up(ms(15), ms(5)), ms(15));
    }

    #[test]
    fn the_next_tick_is_on_the_ticks_grid() {
        assert_eq!(tick_at_or_after(ms(40), ms(100), ms(10)), ms(40));
        assert_eq!(tick_at_or_after(ms(40), ms(100), ms(40)), ms(40));
        assert_eq!(tick_at_or_after(ms(40), ms(100), ms(41)), ms(140));
        assert_eq!(tick_at_or_after(ms(40), ms(100), ms(240)), ms(240));
    }

    #[test]
    fn a_fence_is_judged_again_after_a_step_a_probe_leaving_the_window_or_the_quiet() {
        let window = ms(450);
        let mut fence = FenceChanges::started(ms(0));
        assert_eq!(fence.next_change(None, None), Some(ms(0)));
        fence.judged(ms(5));
        assert_eq!(fence.next_change(None, None), None, "nothing since");
        // A step within step 10 (at 9.3 ms), whose probe counts while the window reaches back
        // to it: until 459.3 ms, gone at step 460.
        fence.stepped(Duration::from_micros(9_300), window);
        assert_eq!(fence.next_change(None, None), Some(ms(10)));
        fence.judged(ms(10));
        assert_eq!(fence.next_change(None, None), Some(ms(460)));
        // At exactly `at + window` the probe still counts.
        fence.stepped(ms(20), window);
        fence.judged(ms(20));
        assert_eq!(fence.next_change(None, None), Some(ms(460)));
        fence.judged(ms(460));
        assert_eq!(fence.next_change(None, None), Some(ms(471)));
        // A quiet end or a reopening already judged is no change.
        assert_eq!(
            fence.next_change(Some(ms(300)), Some(ms(460))),
            Some(ms(471))
        );
        assert_eq!(fence.next_change(Some(ms(465)), None), Some(ms(465)));
    }
}
