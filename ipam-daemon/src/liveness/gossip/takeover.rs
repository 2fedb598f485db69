//! The survivors' half of fencing: a member declared dead still counts as alive, for who
//! answers its IPs, for `takeover_hold` more.
//!
//! A member cut off with a minority goes silent when it no longer sees a majority, and it
//! learns that from its own suspicions of the other side, which run out about when the other
//! side's suspicions of it do: its silence and its death can come at the same moment. The
//! hold puts time between them. A member cut off alone is silent well before (it hears no one
//! for `fence_quiet`, below the suspicion), so the hold is margin on top there.

use std::{collections::HashMap, net::SocketAddr, time::Duration};

pub(super) struct TakeoverHold {
    hold: Duration,
    /// Members declared dead within the hold, and when.
    dead: HashMap<SocketAddr, Duration>,
}

impl TakeoverHold {
    pub(super) fn new(hold: Duration) -> Self {
        Self {
            hold,
            dead: HashMap::new(),
        }
    }

    pub(super) fn declared_dead(&mut self, member: SocketAddr, now: Duration) {
        if !self.hold.is_zero() {
            self.dead.insert(member, now);
        }
    }

    /// The member is alive again (back, or restarted as a new generation).
    pub(super) fn back(&mut self, member: SocketAddr) {
        self.dead.remove(&member);
    }

    /// The members declared dead whose IPs are not to be taken over yet.
    pub(super) fn held(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.dead.keys().copied()
    }

    /// When the next hold ends.
    pub(super) fn next_release(&self) -> Option<Duration> {
        self.dead.values().min().map(|at| *at + self.hold)
    }

    /// Lets go of the members whose hold ended by `now`; `true` when there were any.
    pub(super) fn release(&mut self, now: Duration) -> bool {
        let before = self.dead.len();
        let hold = self.hold;
        self.dead.retain(|_, at| *at + hold > now);
        self.dead.len() != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, i], 7946))
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_dead_member_is_held_until_its_hold_ends() {
        let mut hold = TakeoverHold::new(200 * MS);
        hold.declared_dead(addr(1), 1000 * MS);
        hold.declared_dead(addr(2), 1100 * MS);
        assert_eq!(hold.next_release(), Some(1200 * MS));
        assert!(!hold.release(1199 * MS));
        assert_eq!(hold.held().count(), 2);
        assert!(hold.release(1200 * MS));
        assert_eq!(hold.held().collect::<Vec<_>>(), [addr(2)]);
        assert_eq!(hold.next_release(), Some(1300 * MS));
        assert!(hold.release(1300 * MS));
        assert_eq!(hold.next_release(), None);
    }

    #[test]
    fn a_member_back_is_no_longer_held_and_no_hold_holds_nothing() {
        let mut hold = TakeoverHold::new(200 * MS);
        hold.declared_dead(addr(1), 1000 * MS);
        hold.back(addr(1));
        assert_eq!(hold.held().count(), 0);
        assert!(!hold.release(5000 * MS));

        let mut none = TakeoverHold::new(Duration::ZERO);
        none.declared_dead(addr(1), 1000 * MS);
        assert_eq!(none.next_release(), None);
    }
}
