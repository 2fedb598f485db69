//! Whether this member still reaches the cluster: the input of the fence, which silences a node's
//! responders before the others may take its service IPs over.
//!
//! Four signs, four rules:
//! - **Nothing heard** for `Fence::quiet`: no authenticated packet from any other member. A
//!   healthy member hears a few per probe period (answers to its own probes, others' probes,
//!   gossip), so a silence this long means the node is cut off. `quiet` is shorter than the
//!   suspicion delay, and nobody declares a member dead before its suspicion runs out, so a cut
//!   off node is silent *before* anyone may take over: that difference is the fencing margin.
//! - **Most probes unanswered** over `Fence::window`: the node still hears some members (a
//!   minority cut off together) but more of its own probes fail than are answered, and of at
//!   least two members not heard from since (one dead member failing every probe of it is a
//!   death, not a cut; a member heard from after its probe failed is a lost packet, which is
//!   what keeps a node on a lossy or slow link answering). This one has no hard margin
//!   against the majority's detection, which runs at the same pace (a probe per period each
//!   way); with a window of two periods and a bit, the minority's first two failed probes
//!   close it, and the simulator checks that this is never later than the majority declares
//!   it dead (`tests/simulation.rs`).
//! - **Declared dead**: the others declared this member dead (it heard so and rejoined as a new
//!   generation); they take its IPs over after their hold, so it is silent from then until a
//!   probe of its new generation is answered. This is what silences a node that hears the
//!   others but cannot reach them (a one-way cut), whose failed probes are not counted.
//! - **No majority in view**: the members this one holds alive and unsuspected (itself
//!   included) are not more than half of the cluster's members (from the store's node
//!   records). This is what keeps a minority silent for as long as the partition lasts, once
//!   its probes only go to each other and all succeed.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    time::Duration,
};

use foca::ProbeNumber;

/// What this member heard lately. Times are the member's monotonic clock.
#[derive(Debug, Default)]
pub struct Contact {
    last_heard: Option<Duration>,
    /// When each sender was last heard from (for operators: "last contact"). Senders are
    /// authenticated members, keyed by address: it holds one entry per node address.
    heard_from: HashMap<SocketAddr, Duration>,
    /// Outcomes of this member's own probes, oldest first: `None` when answered, else the
    /// member that did not answer.
    probes: VecDeque<(Duration, Option<SocketAddr>)>,
    last_answered: Option<ProbeNumber>,
    /// The others declared this member dead (it rejoined as a new generation), and none of
    /// its probes was answered since.
    declared_dead: bool,
}

impl Contact {
    /// An authenticated packet from another member was handled.
    pub(crate) fn heard(&mut self, at: Duration, from: SocketAddr) {
        self.last_heard = Some(at);
        self.heard_from.insert(from, at);
    }

    /// When the member at `addr` was last heard from (its packets, not news of it).
    pub fn last_heard_from(&self, addr: SocketAddr) -> Option<Duration> {
        self.heard_from.get(&addr).copied()
    }

    /// Forgets when the senders `is_member` says are no longer members were heard from, once
    /// that is more than `after` before `now`: a long-running member otherwise keeps one entry
    /// per address it ever heard. (A failed probe of a forgotten member counts as unanswered:
    /// it was not heard from since, and the fence's window is far shorter than `after`.)
    pub(crate) fn forget(
        &mut self,
        now: Duration,
        after: Duration,
        is_member: impl Fn(&SocketAddr) -> bool,
    ) {
        self.heard_from
            .retain(|from, at| is_member(from) || now.saturating_sub(*at) <= after);
    }

    /// How many senders this member remembers hearing from.
    pub fn senders_heard(&self) -> usize {
        self.heard_from.len()
    }

    /// An answer to this member's probe `probe`, direct or forwarded (the first one counts).
    pub(crate) fn answered(&mut self, at: Duration, probe: ProbeNumber) {
        if self.last_answered != Some(probe) {
            self.last_answered = Some(probe);
            self.record(at, None);
        }
        // A member answered the new generation: the others can hear this one again.
        self.declared_dead = false;
    }

    /// The others declared this member dead: they may answer for its service IPs once their
    /// takeover hold has passed.
    pub(crate) fn declared_dead(&mut self) {
        self.declared_dead = true;
    }

    /// Whether the others declared this member dead and none of its probes was answered since.
    pub fn is_declared_dead(&self) -> bool {
        self.declared_dead
    }

    /// A probe of this member's, of `target`, went unanswered.
    pub(crate) fn failed(&mut self, at: Duration, target: SocketAddr) {
        self.record(at, Some(target));
    }

    fn record(&mut self, at: Duration, outcome: Option<SocketAddr>) {
        self.probes.push_back((at, outcome));
        // A generous bound: the window holds a few periods' probes.
        while self.probes.len() > 64 {
            self.probes.pop_front();
        }
    }

    /// When another member was last heard from (`None`: never).
    pub fn last_heard(&self) -> Option<Duration> {
        self.last_heard
    }

    /// How long ago another member was last heard from (`None`: never).
    pub fn heard_ago(&self, now: Duration) -> Option<Duration> {
        self.last_heard.map(|at| now.saturating_sub(at))
    }

    /// This member's probes that ended within `window` before `now`. A failed probe counts only
    /// while its target has not been heard from since: on a lossy or slow link probes fail
    /// often, but a member that is then heard from is not out of reach, while a member across
    /// a cut is never heard from again.
    pub fn probes_within(&self, now: Duration, window: Duration) -> Probes {
        let since = now.saturating_sub(window);
        let mut probes = Probes::default();
        let mut unanswering = Vec::new();
        for (at, outcome) in self.probes.iter().filter(|(at, _)| *at >= since) {
            match outcome {
                None => probes.answered += 1,
                // Heard from since: the probe was lost, the member is not out of reach.
                Some(target) if self.heard_from.get(target).is_some_and(|h| h >= at) => {}
                Some(target) => {
                    probes.failed += 1;
                    if !unanswering.contains(target) {
                        unanswering.push(*target);
                    }
                }
            }
        }
        probes.unanswering = unanswering.len();
        probes
    }
}

/// A member's recent probes: how many were answered, how many failed, and of how many
/// different members.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Probes {
    pub answered: usize,
    pub failed: usize,
    pub unanswering: usize,
}

/// The fence's rules (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// Silent after hearing no other member for this long; below the suspicion delay.
    pub quiet: Duration,
    /// Silent while more probes failed than were answered within this window, of at least two
    /// different members.
    pub window: Duration,
}

/// The quiet rule seen from a healthy member: one that has heard nothing for `after` asks two
/// members it holds alive for an answer, and again every `again` while the silence lasts, until
/// `until` (the fence's `quiet`) has passed.
///
/// A member hears an answer to its own probe every probe period, and others' probes besides, so
/// at rest its silences stay under a period and it never says hello. It goes longer without a
/// word when its probe went to a member that no longer answers: with three members and one
/// just stopped, the two left hear each other only through their probes of each other (every
/// other period each) and through the indirect probes of the silent one, and when their phases
/// line up the silence reached 400 ms, past `quiet`: a healthy node's fence closed. A hello is
/// answered within a round trip (foca's announce, answered with a feed), so a member that can
/// reach anyone is heard from before `quiet`; one cut off gets no answer and goes silent as
/// before. Nothing is said once `quiet` has passed: then the probes do the asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub after: Duration,
    pub again: Duration,
    pub until: Duration,
}

impl Hello {
    /// When the next hello is due, given when another member was last heard from and when this
    /// member last said hello; `None` while it has never heard anyone (joining is another
    /// matter) or once the silence has outlasted `until`.
    pub fn next_at(
        &self,
        last_heard: Option<Duration>,
        last_hello: Option<Duration>,
    ) -> Option<Duration> {
        let heard = last_heard?;
        let at = match last_hello {
            Some(said) if said >= heard && self.again.is_zero() => return None,
            Some(said) if said >= heard => said + self.again,
            _ => heard + self.after,
        };
        (at < heard + self.until).then_some(at)
    }
}

/// The cluster as one member sees it, itself included: how many members there are (from the
/// node records in the store), and how many of them it holds alive and unsuspected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub members: usize,
    pub alive: usize,
}

/// Why a member must not answer for its service IPs now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Silenced {
    #[error("no other member heard from yet")]
    NeverHeard,
    #[error("no other member heard from for {} ms", .0.as_millis())]
    NothingHeard(Duration),
    #[error("{failed} of this node's last {} probes went unanswered", .answered + .failed)]
    ProbesUnanswered { answered: usize, failed: usize },
    #[error(
        "the other members declared this node dead; silent until one of them answers its probes"
    )]
    DeclaredDead,
    #[error(
        "only {alive} of the cluster's {members} members are alive as this node sees them: not \
         a majority"
    )]
    Minority { alive: usize, members: usize },
    /// Judged by the daemon, not by [`Fence::judge`]: this node's own record still says its
    /// agent left, so the others reckon their majority without it, and a majority of theirs
    /// need not include it.
    #[error(
        "this node's record still says its agent left (the others do not count it yet): \
         silent until the note is cleared"
    )]
    CountedOut,
}

impl Fence {
    /// Whether a member may answer now. With no other member in `view` (a cluster of one) it
    /// may; otherwise hearing none of them means being cut off.
    pub fn judge(&self, contact: &Contact, now: Duration, view: View) -> Result<(), Silenced> {
        if view.members <= 1 {
            return Ok(());
        }
        match contact.heard_ago(now) {
            None => return Err(Silenced::NeverHeard),
            Some(ago) if ago >= self.quiet => return Err(Silenced::NothingHeard(ago)),
            Some(_) => {}
        }
        // The others take this node's IPs over once their hold has passed: whatever it sees,
        // it must not answer with them. (A node that hears the others but cannot reach them,
        // a one-way cut, learns it this way: its failed probes of members it still hears from
        // are not counted below.)
        if contact.is_declared_dead() {
            return Err(Silenced::DeclaredDead);
        }
        // One dead member fails every probe of it until it is declared dead: that is a death,
        // not this member being cut off. Two members that do not answer, and more failures than
        // answers, is.
        let Probes {
            answered,
            failed,
            unanswering,
        } = contact.probes_within(now, self.window);
        if unanswering >= 2 && failed > answered {
            return Err(Silenced::ProbesUnanswered { answered, failed });
        }
        if view.alive * 2 <= view.members {
            return Err(Silenced::Minority {
                alive: view.alive,
                members: view.members,
            });
        }
        Ok(())
    }
}

/// The fence over time, as a running member keeps it: closed the moment a judgement says so,
/// open again only once it has been judged open for `reopen_after` without a break. A node
/// coming back first learns who is alive, and a minority whose first signs aged out does not
/// answer again in the moment before its last suspicions of the other side land.
#[derive(Debug, Clone)]
pub struct Latch {
    reopen_after: Duration,
    open: bool,
    /// Since when the judgements have said open without a break.
    open_since: Option<Duration>,
}

impl Latch {
    /// A closed fence (a member starts silent).
    pub fn new(reopen_after: Duration) -> Self {
        Self {
            reopen_after,
            open: false,
            open_since: None,
        }
    }

    /// Takes the judgement made at `now`; returns whether the fence is open now.
    pub fn take(&mut self, now: Duration, verdict: &Result<(), Silenced>) -> bool {
        match verdict {
            Ok(()) => {
                let since = *self.open_since.get_or_insert(now);
                if now.saturating_sub(since) >= self.reopen_after {
                    self.open = true;
                }
            }
            Err(_) => {
                self.open_since = None;
                self.open = false;
            }
        }
        self.open
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    /// When a closed fence judged open since then may reopen, if nothing closes it first.
    pub fn reopens_at(&self) -> Option<Duration> {
        self.open_since
            .filter(|_| !self.open)
            .map(|since| since + self.reopen_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FENCE: Fence = Fence {
        quiet: Duration::from_millis(250),
        window: Duration::from_secs(1),
    };

    const FROM: SocketAddr = SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1)),
        7946,
    );

    const OTHER: SocketAddr = SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2)),
        7946,
    );

    const THIRD: SocketAddr = SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 3)),
        7946,
    );

    const ALONE: View = View {
        members: 1,
        alive: 1,
    };
    const THREE: View = View {
        members: 3,
        alive: 3,
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_lone_node_answers_and_a_node_that_expects_peers_waits_to_hear_one() {
        let contact = Contact::default();
        assert_eq!(FENCE.judge(&contact, ms(5), ALONE), Ok(()));
        assert_eq!(
            FENCE.judge(&contact, ms(5), THREE),
            Err(Silenced::NeverHeard)
        );
    }

    #[test]
    fn silence_longer_than_quiet_fences() {
        let mut contact = Contact::default();
        contact.heard(ms(1000), FROM);
        assert_eq!(FENCE.judge(&contact, ms(1249), THREE), Ok(()));
        assert_eq!(
            FENCE.judge(&contact, ms(1250), THREE),
            Err(Silenced::NothingHeard(ms(250)))
        );
    }

    #[test]
    fn more_failed_than_answered_probes_fence_until_they_age_out() {
        let mut contact = Contact::default();
        contact.answered(ms(100), 1);
        contact.answered(ms(110), 1); // the forwarded answer to the same probe
        contact.failed(ms(300), FROM);
        contact.failed(ms(500), OTHER);
        contact.heard(ms(550), THIRD);
        assert_eq!(
            FENCE.judge(&contact, ms(600), THREE),
            Err(Silenced::ProbesUnanswered {
                answered: 1,
                failed: 2
            })
        );
        contact.answered(ms(700), 2);
        contact.heard(ms(700), THIRD);
        assert_eq!(
            FENCE.judge(&contact, ms(700), THREE),
            Ok(()),
            "as many answered as failed"
        );
    }

    #[test]
    fn a_failed_probe_of_a_member_heard_from_since_is_a_lost_packet_not_a_cut() {
        let mut contact = Contact::default();
        contact.failed(ms(300), FROM);
        contact.failed(ms(500), OTHER);
        contact.heard(ms(520), FROM);
        assert_eq!(FENCE.judge(&contact, ms(560), THREE), Ok(()));
        assert_eq!(
            contact.probes_within(ms(560), FENCE.window),
            Probes {
                answered: 0,
                failed: 1,
                unanswering: 1
            }
        );
    }

    #[test]
    fn a_silent_member_says_hello_twice_before_the_quiet_rule_would_close_its_fence() {
        let hello = Hello {
            after: ms(260),
            again: ms(45),
            until: ms(350),
        };
        assert_eq!(hello.next_at(None, None), None, "never heard: joining");
        assert_eq!(hello.next_at(Some(ms(1000)), None), Some(ms(1260)));
        assert_eq!(
            hello.next_at(Some(ms(1000)), Some(ms(900))),
            Some(ms(1260)),
            "a hello of an earlier silence"
        );
        assert_eq!(
            hello.next_at(Some(ms(1000)), Some(ms(1260))),
            Some(ms(1305))
        );
        assert_eq!(
            hello.next_at(Some(ms(1000)), Some(ms(1305))),
            None,
            "past quiet the probes do the asking"
        );
    }

    #[test]
    fn a_member_declared_dead_is_silent_until_one_of_its_probes_is_answered() {
        let mut contact = Contact::default();
        contact.heard(ms(100), FROM);
        contact.declared_dead();
        assert_eq!(
            FENCE.judge(&contact, ms(150), THREE),
            Err(Silenced::DeclaredDead)
        );
        contact.heard(ms(200), FROM);
        assert_eq!(
            FENCE.judge(&contact, ms(200), THREE),
            Err(Silenced::DeclaredDead),
            "hearing the others is not enough: they must hear this one"
        );
        contact.answered(ms(250), 7);
        assert_eq!(FENCE.judge(&contact, ms(250), THREE), Ok(()));
    }

    #[test]
    fn one_dead_member_failing_every_probe_fences_nothing() {
        let mut contact = Contact::default();
        contact.failed(ms(100), OTHER);
        contact.answered(ms(300), 1);
        contact.failed(ms(500), OTHER);
        contact.failed(ms(540), OTHER);
        contact.heard(ms(550), FROM);
        assert_eq!(FENCE.judge(&contact, ms(560), THREE), Ok(()));
    }

    #[test]
    fn a_member_answers_only_while_it_holds_a_majority_alive() {
        let mut contact = Contact::default();
        contact.heard(ms(100), FROM);
        let view = |alive, members| View { alive, members };
        assert_eq!(FENCE.judge(&contact, ms(100), view(2, 3)), Ok(()));
        assert_eq!(
            FENCE.judge(&contact, ms(100), view(2, 5)),
            Err(Silenced::Minority {
                alive: 2,
                members: 5
            })
        );
        assert!(
            FENCE.judge(&contact, ms(100), view(1, 2)).is_err(),
            "half is not a majority"
        );
    }

    #[test]
    fn the_latch_closes_at_once_and_reopens_after_an_unbroken_open_stretch() {
        let mut latch = Latch::new(ms(200));
        let closed = Err(Silenced::NeverHeard);
        assert!(!latch.take(ms(0), &Ok(())), "a member starts silent");
        assert_eq!(latch.reopens_at(), Some(ms(200)));
        assert!(!latch.take(ms(150), &closed));
        assert_eq!(latch.reopens_at(), None);
        assert!(!latch.take(ms(160), &Ok(())));
        assert!(!latch.take(ms(359), &Ok(())));
        assert!(
            latch.take(ms(360), &Ok(())),
            "open for 200 ms without a break"
        );
        assert!(!latch.take(ms(361), &closed), "closed at once");
        assert!(!latch.is_open());
    }
}
