//! A member's timers: foca's, due in order, with its periodic gossip round put aside while
//! there is nothing to gossip.
//!
//! foca runs the round every `gossip_every` (25 ms by default) whether or not it has news, and
//! without news the round only schedules the next: forty wake-ups a second of every agent at
//! rest, for nothing. Here a round that comes due with no news waits aside, and is due again
//! the moment there is news; foca then gossips and schedules the next round as it would have.

use std::time::Duration;

use foca::Timer;

use crate::{PeerId, queue::Queue};

pub(crate) struct Timers {
    due: Queue<Timer<PeerId>>,
    /// The gossip round that came due with no news, if one did.
    idle_gossip: Option<Timer<PeerId>>,
}

impl Timers {
    pub(crate) fn new() -> Self {
        Self {
            due: Queue::new(),
            idle_gossip: None,
        }
    }

    /// A timer foca asked for. A new gossip round supersedes one set aside (foca starts a new
    /// series of rounds each time it connects, and would have let the old one lapse).
    pub(crate) fn submit(&mut self, at: Duration, timer: Timer<PeerId>) {
        if matches!(timer, Timer::PeriodicGossip(_)) {
            self.idle_gossip = None;
        }
        self.due.push(at, timer);
    }

    /// The earliest timer due by `now` for foca; a gossip round due while there is no news
    /// (`news` false) is set aside instead.
    pub(crate) fn pop_due(&mut self, now: Duration, news: bool) -> Option<Timer<PeerId>> {
        loop {
            let timer = self.due.pop_due(now)?;
            if !news && matches!(timer, Timer::PeriodicGossip(_)) {
                self.idle_gossip = Some(timer);
                continue;
            }
            return Some(timer);
        }
    }

    /// There is news to gossip: a round set aside is due at once.
    pub(crate) fn news(&mut self, now: Duration) {
        if let Some(timer) = self.idle_gossip.take() {
            self.due.push(now, timer);
        }
    }

    /// When the earliest timer is due.
    pub(crate) fn next_at(&self) -> Option<Duration> {
        self.due.next_at()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn round(token: u8) -> Timer<PeerId> {
        Timer::PeriodicGossip(token)
    }

    #[test]
    fn a_round_without_news_waits_aside_until_there_is_news() {
        let mut timers = Timers::new();
        timers.submit(ms(25), round(0));
        timers.submit(ms(200), Timer::ProbeRandomMember(0));
        assert!(
            timers.pop_due(ms(30), false).is_none(),
            "no news: nothing for foca"
        );
        assert_eq!(
            timers.next_at(),
            Some(ms(200)),
            "the round no longer wakes the member"
        );
        timers.news(ms(40));
        assert_eq!(timers.next_at(), Some(ms(40)));
        assert!(matches!(
            timers.pop_due(ms(40), true),
            Some(Timer::PeriodicGossip(0))
        ));
        assert!(matches!(
            timers.pop_due(ms(200), false),
            Some(Timer::ProbeRandomMember(0))
        ));
    }

    #[test]
    fn a_round_with_news_is_due_as_foca_asked() {
        let mut timers = Timers::new();
        timers.submit(ms(25), round(0));
        assert!(matches!(
            timers.pop_due(ms(25), true),
            Some(Timer::PeriodicGossip(0))
        ));
        timers.news(ms(30));
        assert_eq!(timers.next_at(), None, "nothing was set aside");
    }

    #[test]
    fn a_new_series_of_rounds_supersedes_the_one_set_aside() {
        let mut timers = Timers::new();
        timers.submit(ms(25), round(0));
        assert!(timers.pop_due(ms(25), false).is_none());
        timers.submit(ms(60), round(1));
        timers.news(ms(70));
        assert!(matches!(
            timers.pop_due(ms(70), true),
            Some(Timer::PeriodicGossip(1))
        ));
        assert!(
            timers.pop_due(ms(1_000), true).is_none(),
            "only one series runs"
        );
    }
}
