//! Break before make: an IP another live node may still be answering for is taken only after
//! that node has had time to let go of it.
//!
//! Every node decides alone from the same inputs, but the inputs reach the nodes at slightly
//! different times (a watch event, a lease renewal, a tick of 100 ms, a rest between decisions
//! under a stream of changes). When an IP moves between two live nodes (a node returns or
//! joins, one is excluded, a Local Service's endpoint moves), the new owner waits `HANDOVER`
//! before answering, so the old one, deciding on the same change at its next decision, has
//! gone silent first. A takeover from a dead node waits for nothing: the
//! dead node's fence has silenced it already, and that wait is what failover time is made of.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use super::{
    OwnedIps,
    pacing::{DECISION, MAX_REST, TICK},
};

/// How long the new owner of an IP waits when its previous owner is alive: the longest the old
/// owner may take to let go ([`lets_go_within`]) with the pacing every node runs. Each node
/// knows only its own pace, so the wait is that of the slowest pace allowed (the rest's cap),
/// not of this node's: 750 ms.
pub const HANDOVER: Duration = lets_go_within(TICK, MAX_REST, DECISION);

/// How much later a change may reach one node than another (a watch event's delivery), with
/// the responder's write of what a decision let go.
const DELIVERY: Duration = Duration::from_millis(100);

/// The longest a node deciding at most every `tick`, resting at most `max_rest` between
/// decisions that take at most `decision`, takes to let go of an IP after another node decided
/// to take it on the same change: the change reaches it [`DELIVERY`] later, just after its
/// decision in progress began (which misses it), then it rests, waits for its next tick, and
/// decides.
pub const fn lets_go_within(tick: Duration, max_rest: Duration, decision: Duration) -> Duration {
    let ms =
        DELIVERY.as_millis() + decision.as_millis() * 2 + max_rest.as_millis() + tick.as_millis();
    Duration::from_millis(ms as u64)
}

/// Who held an IP before this node decided to take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Previous {
    /// Nobody in this node's last decision, and this node was live in it: a new IP.
    Nobody,
    /// Nobody that this node knew of, because this node was not live itself (it is starting,
    /// or returning after its lease or its view of the others lapsed): another node may hold it.
    Unknown,
    /// A node this node holds dead: its fence has silenced it.
    Dead(String),
    /// A node that is alive: it lets go at its next decision.
    Alive(String),
}

impl Previous {
    /// Where the IP came from, for the moves metric: `dead_node`, `live_node`, or `none` (a
    /// new IP, or one this node could not know the holder of).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Dead(_) => "dead_node",
            Self::Alive(_) => "live_node",
            Self::Nobody | Self::Unknown => "none",
        }
    }

    /// Whether taking the IP must wait for its previous owner to let go.
    fn must_wait(&self) -> bool {
        matches!(self, Self::Unknown | Self::Alive(_))
    }
}

/// The IPs this node owns but waits to answer for, with since when and from whom.
#[derive(Debug, Default)]
pub struct Handover {
    waiting: BTreeMap<IpAddr, (Instant, Previous)>,
}

impl Handover {
    /// When the first IP that waits may be admitted, with nothing else changed.
    pub fn next_due(&self) -> Option<Instant> {
        self.waiting
            .values()
            .map(|(since, _)| *since + HANDOVER)
            .min()
    }

    /// What this node answers for now, of `mine` (what it owns by the last decision), given
    /// what it answers for already (`answering`) and who held each new IP (`previous`). The
    /// second part names, for each IP newly answered, who held it before the wait began.
    pub fn admit(
        &mut self,
        mine: OwnedIps,
        answering: &OwnedIps,
        mut previous: impl FnMut(IpAddr) -> Previous,
        now: Instant,
    ) -> (OwnedIps, BTreeMap<IpAddr, Previous>) {
        self.waiting.retain(|ip, _| mine.contains_key(ip));
        let mut admitted = OwnedIps::new();
        let mut from = BTreeMap::new();
        for (ip, owned) in mine {
            if answering.contains_key(&ip) {
                admitted.insert(ip, owned);
                continue;
            }
            let (since, held_by) = self
                .waiting
                .entry(ip)
                .or_insert_with(|| (now, previous(ip)));
            if held_by.must_wait() && now.saturating_duration_since(*since) < HANDOVER {
                continue;
            }
            let (_, held_by) = self.waiting.remove(&ip).expect("just looked up");
            from.insert(ip, held_by);
            admitted.insert(ip, owned);
        }
        (admitted, from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l2::OwnedIp;

    fn owned(ips: &[&str]) -> OwnedIps {
        ips.iter()
            .map(|ip| {
                let owned = OwnedIp {
                    service: format!("default/{ip}"),
                    interfaces: vec!["eth0".into()],
                };
                (ip.parse().unwrap(), owned)
            })
            .collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_new_ip_and_one_from_a_dead_node_are_answered_at_once() {
        let mut handover = Handover::default();
        let now = Instant::now();
        let (admitted, from) = handover.admit(
            owned(&["10.0.0.1", "fd00::1"]),
            &OwnedIps::new(),
            |ip| match ip {
                IpAddr::V4(_) => Previous::Nobody,
                IpAddr::V6(_) => Previous::Dead("node-1".into()),
            },
            now,
        );
        assert_eq!(admitted, owned(&["10.0.0.1", "fd00::1"]));
        assert_eq!(from[&ip("fd00::1")], Previous::Dead("node-1".into()));
        assert!(handover.waiting.is_empty());
    }

    #[test]
    fn an_ip_held_by_a_live_node_or_by_nobody_known_waits_the_handover() {
        let mut handover = Handover::default();
        let start = Instant::now();
        let mine = owned(&["10.0.0.1", "10.0.0.2"]);
        let previous = |ip: IpAddr| {
            if ip == self::ip("10.0.0.1") {
                Previous::Alive("node-1".into())
            } else {
                Previous::Unknown
            }
        };
        let (admitted, _) = handover.admit(mine.clone(), &OwnedIps::new(), previous, start);
        assert!(admitted.is_empty());
        assert!(!handover.waiting.is_empty());

        // Who held it is judged when the wait began, not again when it ends.
        let later = start + HANDOVER - Duration::from_millis(1);
        let (admitted, _) =
            handover.admit(mine.clone(), &OwnedIps::new(), |_| Previous::Nobody, later);
        assert!(admitted.is_empty(), "still waiting");

        let (admitted, from) = handover.admit(
            mine.clone(),
            &OwnedIps::new(),
            |_| Previous::Nobody,
            start + HANDOVER,
        );
        assert_eq!(admitted, mine);
        assert_eq!(from[&ip("10.0.0.1")], Previous::Alive("node-1".into()));
        assert_eq!(from[&ip("10.0.0.2")], Previous::Unknown);
        assert!(handover.waiting.is_empty());

        // Once answered, it stays answered with no wait.
        let (admitted, from) = handover.admit(
            mine.clone(),
            &mine,
            |_| Previous::Alive("node-1".into()),
            start + HANDOVER,
        );
        assert_eq!(admitted, mine);
        assert!(from.is_empty());
    }

    #[test]
    fn an_ip_no_longer_owned_stops_waiting_and_waits_afresh_when_owned_again() {
        let mut handover = Handover::default();
        let start = Instant::now();
        let alive = |_| Previous::Alive("node-1".into());
        handover.admit(owned(&["10.0.0.1"]), &OwnedIps::new(), alive, start);
        handover.admit(OwnedIps::new(), &OwnedIps::new(), alive, start);
        assert!(handover.waiting.is_empty());
        let back = start + HANDOVER;
        let (admitted, _) = handover.admit(owned(&["10.0.0.1"]), &OwnedIps::new(), alive, back);
        assert!(admitted.is_empty(), "the wait starts again");
    }
}
