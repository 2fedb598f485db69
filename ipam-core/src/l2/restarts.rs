//! Nodes held live while their agents restart (`[node] on_stop = "restart"`): the others keep
//! such a node's Service IPs where they are for what it promised, so a rolling upgrade moves
//! no IP. The stopping side of the promise is the daemon's `liveness::restart`.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant, SystemTime},
};

use super::NodeRecords;
use crate::resources::{NodeIpam, RestartNotice};

/// How far behind a starting agent's clock that of a node stopping for a restart may be: a
/// notice found at the start holds its node until its `sinceUnixMs` and `withinMs`, and this
/// much more, have passed by this agent's clock. NTP keeps nodes' clocks within milliseconds
/// of each other; a clock further behind shortens that hold by the difference (the restarting
/// node's responders may then answer for a moment next to the node that takes its IPs over).
pub const CLOCK_SKEW: Duration = Duration::from_millis(500);

/// How long a held node whose notice was cleared may stay unheard before its hold ends: its
/// next agent clears the notice once its fence opens, and the others hear it within a
/// gossip round trip or two; a node whose promise failed withdraws its notice and stays silent.
pub const CLEARED_GRACE: Duration = Duration::from_secs(2);

/// The longest restart any agent may promise (`[node] restart_within_ms`'s bound).
pub const LONGEST_PROMISE_MS: u64 = 60_000;

/// A notice's `withinMs`, no longer than any agent may promise (another node's record is its
/// own word).
fn bounded_within(notice: &RestartNotice) -> u64 {
    notice.within_ms.min(LONGEST_PROMISE_MS)
}

/// `at` in Unix milliseconds, as a [`RestartNotice`] counts them.
pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Nodes whose agents stopped for a restart (`spec.restarting` in their records), held live
/// for the promised time from when this agent saw each notice, so their IPs stay where they
/// are (`liveness::restart`), until they are live in the gossip again.
#[derive(Debug, Default)]
pub struct Restarts {
    /// This node's name, when the agent before this one stopped for a restart and its promise
    /// runs (`Inputs::inherited`): this node's own notice holds it live as well until its next
    /// agent (this one) clears it, once its fence has opened. A notice of its own found
    /// otherwise is left behind by an agent that did not keep its promise, and holds nothing:
    /// the others hold it no more, and this node must not answer their IPs before they hear it.
    own_promise: Option<String>,
    held: BTreeMap<String, (RestartNotice, Instant)>,
    /// Held nodes whose notice is gone from their record, since when.
    cleared: BTreeMap<String, Instant>,
    /// The last notice seen of each node: each is held once, from when it was first seen, not
    /// again when a record that still carries it changes (a notice left behind must not hold
    /// a node that died later).
    seen: BTreeMap<String, RestartNotice>,
}

impl Restarts {
    /// `node`'s holds at the start, from the records as first listed (`nodes`), at `now`
    /// (`now_unix_ms` by the wall clock): its own notice counts only if `inherited`. Every
    /// notice already there is taken as seen, and holds its node only for what is left
    /// of its promise by the wall clock (`sinceUnixMs` and `withinMs`, and [`CLOCK_SKEW`]):
    /// the restarting node's responders may answer until then, and taking its IPs over
    /// meanwhile would give them two MACs. A notice left for good by a node that never came
    /// back is older than that, and holds nothing: held for its `withinMs` at every agent
    /// start, it would hand that node's IPs back to nobody at each step of a rollout.
    pub fn new(
        node: &str,
        inherited: bool,
        nodes: &dyn NodeRecords,
        now: Instant,
        now_unix_ms: u64,
    ) -> Self {
        let mut restarts = Self {
            own_promise: inherited.then(|| node.to_owned()),
            ..Self::default()
        };
        for (name, record) in nodes.each() {
            if let Some(notice) = &record.spec.restarting {
                restarts.seen.insert(name.to_owned(), notice.clone());
                // This node's own notice holds it only if its agent took up the promise; then,
                // as any other, for what is left of it (counted from the agent's start it
                // outlived the others' holds, and this node kept its IPs while they took them).
                if name == node && !inherited {
                    continue;
                }
                let skew = u64::try_from(CLOCK_SKEW.as_millis()).unwrap_or(u64::MAX);
                let within = bounded_within(notice);
                let ends = notice
                    .since_unix_ms
                    .saturating_add(within)
                    .saturating_add(skew);
                // Never longer than a promise made now: a notice stamped in the future (its
                // writer's clock ahead, or this node's behind, as after a reboot before NTP)
                // would otherwise hold a node, and leave its IPs unanswered, for that long.
                let left = ends.saturating_sub(now_unix_ms).min(within + skew);
                if left > 0 {
                    tracing::info!(
                        node = name,
                        left_ms = left,
                        "node {}'s agent stopped for a restart before this one started: its \
                         Service IPs stay with it for up to {left} ms",
                        name
                    );
                    let until = now + Duration::from_millis(left);
                    restarts
                        .held
                        .insert(name.to_owned(), (notice.clone(), until));
                }
            }
        }
        restarts
    }

    /// Takes in new notices from the records, each held from `now`.
    pub fn follow(&mut self, nodes: &dyn NodeRecords, me: &str, now: Instant) {
        let own_held = self.own_promise.as_deref() == Some(me);
        for (name, record) in nodes.each().filter(|(name, _)| *name != me || own_held) {
            self.follow_one(name, record, now);
        }
    }

    /// Takes in `node`'s notice, if its record has a new one, held from `now`.
    fn follow_one(&mut self, node: &str, record: &NodeIpam, now: Instant) {
        let Some(notice) = &record.spec.restarting else {
            return;
        };
        if self.seen.get(node) == Some(notice) {
            return;
        }
        self.seen.insert(node.to_owned(), notice.clone());
        self.cleared.remove(node);
        let until = now + Duration::from_millis(bounded_within(notice));
        tracing::info!(
            node,
            within_ms = notice.within_ms,
            "node {node}'s agent stops for a restart: its Service IPs stay with it for up to {} ms",
            notice.within_ms
        );
        self.held.insert(node.to_owned(), (notice.clone(), until));
    }

    /// Drops the holds that ran out, and those of nodes back: live in the gossip, the notice
    /// cleared by their next agent (a later death of theirs is one like any other). A notice
    /// cleared while its node stays silent for [`CLEARED_GRACE`] ends its hold too: a next
    /// agent clears it only once it hears a majority, and is heard within that; a node whose
    /// promise failed withdraws it and stops, and is never heard.
    pub fn prune(
        &mut self,
        nodes: &dyn NodeRecords,
        live: &mut dyn FnMut(&str) -> bool,
        now: Instant,
    ) {
        let cleared = &mut self.cleared;
        self.held.retain(|node, (_, until)| {
            let notice_cleared = nodes
                .record(node)
                .is_none_or(|r| r.spec.restarting.is_none());
            if !notice_cleared {
                // Back in the record: a later clearing starts its grace anew.
                cleared.remove(node);
            }
            let cleared_since = notice_cleared.then(|| *cleared.entry(node.clone()).or_insert(now));
            let withdrawn = cleared_since.is_some_and(|at| now.duration_since(at) >= CLEARED_GRACE);
            let back = notice_cleared && live(node);
            if withdrawn && !back {
                tracing::info!(
                    node = node.as_str(),
                    "node {node}'s restart notice was withdrawn and the node is not heard: its \
                     Service IPs move as from a dead node"
                );
                return false;
            }
            if now >= *until && !back {
                tracing::warn!(
                    node = node.as_str(),
                    "node {node}'s agent did not come back from its restart in time: its \
                     Service IPs move as from a dead node"
                );
            }
            now < *until && !back
        });
        // Only held nodes' clearings are waited on (`next_due` names their grace's end).
        cleared.retain(|node, _| self.held.contains_key(node));
    }

    /// Whether `node` is held live at `now`.
    pub fn holds(&self, node: &str, now: Instant) -> bool {
        self.held.get(node).is_some_and(|(_, until)| now < *until)
    }

    /// Whether `node` is held at `now` and keeps the IPs it owns by hashing: its notice has no
    /// list (an agent of a release before the list). A notice with a list keeps those IPs
    /// alone (`promised`), none if it is empty (its node answered nothing when it stopped:
    /// say, every IP still waiting a hand-over after its fence reopened); the others are
    /// decided among the nodes heard, or a node held would own IPs nobody answers for its
    /// promise.
    pub fn holds_by_hashing(&self, node: &str, now: Instant) -> bool {
        self.held
            .get(node)
            .is_some_and(|(notice, until)| now < *until && notice.answering.is_none())
    }

    /// The nodes held (their holds may have run out since the last prune).
    pub fn held_nodes(&self) -> impl Iterator<Item = &str> {
        self.held.keys().map(String::as_str)
    }

    /// The IPs `node` said it answers on while it restarts, if it is held at `now` and its
    /// notice lists them.
    pub fn answering(&self, node: &str, now: Instant) -> Option<&[std::net::IpAddr]> {
        self.held
            .get(node)
            .filter(|(_, until)| now < *until)
            .and_then(|(notice, _)| notice.answering.as_deref())
    }

    /// Whether a hold is kept (running, or run out and not yet pruned by a decision).
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// When a hold may next end with nothing else changed: its promise runs out, or its
    /// notice was cleared [`CLEARED_GRACE`] ago with the node still unheard (that end is
    /// found by `prune`, which a decision runs).
    pub fn next_due(&self) -> Option<Instant> {
        let ends = self.held.values().map(|(_, until)| *until);
        let withdrawn = self.cleared.values().map(|at| *at + CLEARED_GRACE);
        ends.chain(withdrawn).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::NodeIpamSpec;

    /// The wall clock at an agent start long after the notices of the tests were written
    /// (`sinceUnixMs` of a few milliseconds): they are all over.
    const LATER_MS: u64 = 3_600_000;

    fn records(notice: Option<RestartNotice>) -> BTreeMap<String, NodeIpam> {
        records_of(&[("node-1", notice)])
    }

    /// Node records by name, each with its restart notice.
    fn records_of(nodes: &[(&str, Option<RestartNotice>)]) -> BTreeMap<String, NodeIpam> {
        nodes
            .iter()
            .map(|(name, notice)| {
                let record = NodeIpam {
                    spec: NodeIpamSpec {
                        restarting: notice.clone(),
                        ..NodeIpamSpec::default()
                    },
                    ..NodeIpam::default()
                };
                ((*name).to_owned(), record)
            })
            .collect()
    }

    #[test]
    fn a_restart_notice_holds_its_node_once_for_its_time_from_when_it_was_seen() {
        let notice = RestartNotice {
            within_ms: 2_000,
            since_unix_ms: 1,
            answering: None,
        };
        let mut restarts = Restarts::default();
        let t0 = Instant::now();
        restarts.follow(&records(Some(notice.clone())), "node-0", t0);
        assert!(restarts.holds("node-1", t0 + Duration::from_millis(1_999)));
        assert!(!restarts.holds("node-1", t0 + Duration::from_millis(2_000)));
        assert!(!restarts.holds("node-2", t0));
        // The same notice seen again later (another change of the record) holds nothing anew:
        // a notice left behind must not keep a node that died since.
        restarts.held.clear();
        restarts.follow(
            &records(Some(notice)),
            "node-0",
            t0 + Duration::from_secs(60),
        );
        assert!(!restarts.holding());
        // A new restart is held again.
        let next = RestartNotice {
            within_ms: 2_000,
            since_unix_ms: 2,
            answering: None,
        };
        let t1 = t0 + Duration::from_secs(120);
        restarts.follow(&records(Some(next)), "node-0", t1);
        assert!(restarts.holds("node-1", t1 + Duration::from_secs(1)));
    }

    #[test]
    fn a_node_s_own_notice_holds_it_only_when_its_agent_took_up_the_promise() {
        let notice = Some(RestartNotice {
            within_ms: 2_000,
            since_unix_ms: 1,
            answering: None,
        });
        let t0 = Instant::now();
        // The agent before promised and its responders answer on: this one holds its node
        // live until its notice is cleared, as the others do.
        // Half a second into the promise (2 s, and the skew): 2 s are left.
        let mut kept = Restarts::new("node-1", true, &records(notice.clone()), t0, 501);
        assert!(kept.holds("node-1", t0 + Duration::from_secs(1)));
        kept.follow(
            &records(notice.clone()),
            "node-1",
            t0 + Duration::from_secs(1),
        );
        assert!(kept.holds("node-1", t0 + Duration::from_millis(1_999)));
        assert!(!kept.holds("node-1", t0 + Duration::from_secs(2)));
        // A notice left by an agent whose promise ran out: the others hold the node no more,
        // and this one must not answer for its IPs before they hear it.
        let mut lapsed = Restarts::new("node-1", false, &records(notice.clone()), t0, LATER_MS);
        assert!(!lapsed.holding());
        lapsed.follow(&records(notice), "node-1", t0);
        assert!(!lapsed.holding());
    }

    /// An agent that starts while another node's restart is under way (its notice in the
    /// records at the start) holds that node for what is left of its promise by the wall
    /// clock, and the clock skew allowed: its responders still answer its IPs, and taking them
    /// over meanwhile would give them two MACs. One whose promise ran out holds nothing.
    #[test]
    fn a_restart_under_way_at_the_start_is_held_for_the_time_left() {
        let since = 1_000_000;
        let notice = Some(RestartNotice {
            within_ms: 10_000,
            since_unix_ms: since,
            answering: None,
        });
        let at_start = records_of(&[("node-0", None), ("node-1", notice.clone())]);
        let t0 = Instant::now();
        let skew = Duration::from_millis(u64::try_from(CLOCK_SKEW.as_millis()).unwrap());
        // 4 s into the promise: 6 s and the skew are left.
        let mut recent = Restarts::new("node-0", false, &at_start, t0, since + 4_000);
        let left = Duration::from_secs(6) + skew;
        assert!(recent.holds("node-1", t0 + left - Duration::from_millis(1)));
        assert!(!recent.holds("node-1", t0 + left));
        // The first record event brings the same notice: held no longer than that.
        recent.follow(&at_start, "node-0", t0 + Duration::from_secs(1));
        assert!(!recent.holds("node-1", t0 + left));
        // Past the promise and the skew: nothing held.
        let over = since + 10_000 + u64::try_from(CLOCK_SKEW.as_millis()).unwrap();
        let old = Restarts::new("node-0", false, &at_start, t0, over);
        assert!(!old.holding());
        // This node's own notice, its promise not taken up, holds nothing even if recent.
        let own = Restarts::new("node-1", false, &at_start, t0, since + 1);
        assert!(!own.holds("node-1", t0));
    }

    /// A notice stamped in the future (its writer's clock ahead, a compromised node, or this
    /// node's clock behind after a reboot) holds its node no longer than a promise made now.
    #[test]
    fn a_notice_from_the_future_holds_no_longer_than_a_promise() {
        let notice = Some(RestartNotice {
            within_ms: u64::MAX,
            since_unix_ms: u64::MAX / 2,
            answering: None,
        });
        let at_start = records_of(&[("node-0", None), ("node-1", notice)]);
        let t0 = Instant::now();
        let restarts = Restarts::new("node-0", false, &at_start, t0, 1_000);
        let longest = Duration::from_millis(LONGEST_PROMISE_MS) + CLOCK_SKEW;
        assert!(restarts.holds("node-1", t0 + longest - Duration::from_millis(1)));
        assert!(!restarts.holds("node-1", t0 + longest));
    }

    /// A node whose promise failed withdraws its notice and stops: once its notice is gone
    /// and it stays unheard for `CLEARED_GRACE`, its hold ends and its IPs move, well before
    /// the promise would have run out. A node heard again ends it at once, as before.
    #[test]
    fn a_withdrawn_notice_of_a_silent_node_ends_its_hold() {
        let notice = Some(RestartNotice {
            within_ms: 10_000,
            since_unix_ms: 1,
            answering: None,
        });
        let t0 = Instant::now();
        let mut restarts = Restarts::new("node-0", false, &records_of(&[("node-0", None)]), t0, 0);
        restarts.follow(
            &records_of(&[("node-0", None), ("node-1", notice)]),
            "node-0",
            t0,
        );
        let mut silent = |node: &str| node == "node-0";
        let withdrawn = records_of(&[("node-0", None), ("node-1", None)]);
        let t1 = t0 + Duration::from_millis(100);
        restarts.prune(&withdrawn, &mut silent, t1);
        assert!(restarts.holds("node-1", t1), "ended before the grace");
        let t2 = t1 + CLEARED_GRACE;
        restarts.prune(&withdrawn, &mut silent, t2);
        assert!(!restarts.holds("node-1", t2), "held after the grace");
    }

    /// Issue 56, item 2: a node that died in the middle of a restart leaves its notice in its
    /// record for good. An agent starting later (each step of a rollout) must not hold that
    /// node live at its first record event: the IPs the others took over from it would be
    /// handed back to the dead node, answered by nobody, for the notice's `withinMs`.
    #[test]
    fn a_notice_found_at_the_start_holds_nothing_and_a_later_one_holds_its_node() {
        let stale = Some(RestartNotice {
            within_ms: 2_000,
            since_unix_ms: 1,
            answering: None,
        });
        let t0 = Instant::now();
        let at_start = records_of(&[("node-0", None), ("node-1", stale.clone())]);
        let mut restarts = Restarts::new("node-0", false, &at_start, t0, LATER_MS);
        assert!(!restarts.holding(), "a notice found at the start");
        // The first record event (any record changed, here this node's own) brings the same
        // stale notice again: still nothing held, at any time after.
        let t1 = t0 + Duration::from_millis(10);
        restarts.follow(
            &records_of(&[("node-0", None), ("node-1", stale.clone())]),
            "node-0",
            t1,
        );
        assert!(
            !restarts.holds("node-1", t1),
            "the dead node held live at the first record event: its IPs answered by nobody"
        );
        assert!(!restarts.holding());
        // The node's next agent clears it; a restart after that is held as any other.
        let t2 = t0 + Duration::from_secs(60);
        restarts.follow(&records_of(&[("node-1", None)]), "node-0", t2);
        let next = Some(RestartNotice {
            within_ms: 2_000,
            since_unix_ms: 2,
            answering: None,
        });
        restarts.follow(&records_of(&[("node-1", next)]), "node-0", t2);
        assert!(restarts.holds("node-1", t2 + Duration::from_secs(1)));
        // A restart notice that comes after the start, of another node, is held at once.
        let mut later = Restarts::new(
            "node-0",
            false,
            &records_of(&[("node-2", None)]),
            t0,
            LATER_MS,
        );
        later.follow(&records_of(&[("node-2", stale)]), "node-0", t1);
        assert!(later.holds("node-2", t1 + Duration::from_millis(1_999)));
    }
}
