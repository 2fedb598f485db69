//! How fast the gossip detects a dead peer, and what that costs.
//!
//! SWIM's detection time is the sum of three parts:
//! 1. **until someone probes the dead peer**: every member probes one peer per `probe_period`,
//!    so the dead one is probed about once per period, cluster-wide, whatever the size;
//! 2. **the probe failing**: no answer within `probe_rtt`, then none through
//!    `indirect_probes` others before the period ends; the prober now suspects it;
//! 3. **the suspicion timing out** (`suspect_to_down`) on the member whose probe failed, which
//!    then declares the peer dead; that news spreads like the suspicion did, on every message
//!    and on the periodic gossip, within a few rounds.
//!
//! The suspicion delay is what keeps a lossy link from flapping ownership: a suspected member
//! that is alive hears of the suspicion and refutes it (a higher incarnation) before it runs
//! out. The suspicion has to reach the suspect, and its refutation the prober, which is why
//! changes are passed on more often than foca's own rule, and at least 12 times (below).
//!
//! At rest a member sends one probe and answers about one per period: the traffic per member
//! does not grow with the cluster, and neither does the dissemination backlog, which holds only
//! changes.

use std::{
    num::{NonZeroU8, NonZeroU32, NonZeroUsize},
    time::Duration,
};

/// The fewest times a member passes each change on, whatever the cluster's size.
const MIN_TRANSMISSIONS: u8 = 12;

/// The gossip's timings.
///
/// With the defaults a dead member of a small cluster is declared dead by all in 0.8 s (median;
/// 1.2 s at most), and a member on a link with 20 % loss and 50–100 ms of delay is rarely even
/// suspected (4 suspicions and no death in 16 minutes among 50; `tests/simulation.rs` checks 2
/// minutes), nor one losing 20 % among three, where suspicions come every second (none declared
/// dead in 4 hours).
/// The short `probe_rtt` and the many indirect probes are what make that: the indirect probes
/// start early enough to come back through a slow link within the period. docs/liveness.md has
/// the measured trade-offs (`examples/timing_sweep.rs`), and `cargo xtask bench liveness` the
/// figures at 5,000 members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    pub probe_period: Duration,
    /// How long a direct probe waits before asking others to probe too. A late answer still
    /// counts until the period ends, so this only needs to be above a healthy round trip (a
    /// LAN's is well under a millisecond); the shorter it is, the more of the period the
    /// indirect probes have to come back through a slow link.
    pub probe_rtt: Duration,
    pub indirect_probes: usize,
    pub suspect_to_down: Duration,
    /// How often a member with news sends it to `gossip_fanout` random peers, on top of the
    /// probes that carry it anyway. Nothing is sent without news, and each change is passed on
    /// a fixed number of times whatever the rate, so a faster round costs no bytes, only
    /// spreads sooner: at 5,000 members the last member learns of a death 0.13–0.18 s after the
    /// first, against 0.30–0.35 s every 50 ms to 3 (`examples/detect_parts.rs`).
    pub gossip_every: Duration,
    pub gossip_fanout: usize,
    /// How often a member says hello to a couple of the members it holds dead, so that the two
    /// sides of a healed partition find each other again (and a wrongly buried member comes
    /// back as its next generation).
    pub reannounce_every: Duration,
    /// The fence (see [`crate::contact`]): silent after hearing no member for this long. Must
    /// stay below `suspect_to_down`; the difference is the fencing margin.
    pub fence_quiet: Duration,
    /// The fence: silent while most of this member's probes within this window failed.
    pub fence_window: Duration,
    /// How long the survivors still count a member declared dead as alive, for who answers
    /// its IPs. A member cut off with a minority goes silent when it sees no majority, which
    /// can be the very moment the majority declares it dead (each side's suspicions of the
    /// other run out together); this hold is what lies between its silence and anyone else
    /// answering.
    pub takeover_hold: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            probe_period: Duration::from_millis(200),
            probe_rtt: Duration::from_millis(30),
            indirect_probes: 8,
            suspect_to_down: Duration::from_millis(400),
            gossip_every: Duration::from_millis(25),
            gossip_fanout: 4,
            reannounce_every: Duration::from_secs(2),
            fence_quiet: Duration::from_millis(350),
            fence_window: Duration::from_millis(450),
            takeover_hold: Duration::from_millis(200),
        }
    }
}

impl Timing {
    /// The fence these timings give.
    pub fn fence(&self) -> crate::Fence {
        crate::Fence {
            quiet: self.fence_quiet,
            window: self.fence_window,
        }
    }

    /// How long a closed fence must be judged open without a break before it opens again:
    /// as long as the other side takes from a suspicion to answering for a member
    /// (`suspect_to_down` and `takeover_hold`). A minority's first signs (its failed probes of
    /// the other side) age out of the fence's window before it has suspected every member
    /// across the cut, which the rule of the majority needs; its suspicions come at the same
    /// pace as the other side's, so within this time the last ones land and keep it closed.
    /// With one probe period instead, a minority of two in five answered again after the
    /// majority took over in 27 of 600 simulated cuts; with this, in none of 2,000
    /// (`examples/fence_study.rs`).
    pub fn fence_reopen(&self) -> Duration {
        self.suspect_to_down + self.takeover_hold
    }

    /// When a member that has heard nothing says hello ([`crate::Hello`]): once silent for
    /// a probe period and two round trips' waits, and again halfway to `fence_quiet`, so that
    /// one lost hello or answer does not close a healthy member's fence. At rest an answer to
    /// its own probe comes every period; when that answer is lost, the indirect probes' answers
    /// come a `probe_rtt` after it was due, and a hello then would race them: with one wait
    /// instead of two, 5,000 members at 1 % loss said about one hello each every half minute
    /// and sent 5 % more bytes (`cargo xtask bench liveness`); with two, none. With the
    /// defaults: at 260 and 305 ms, the fence's quiet rule at 350.
    pub fn hello(&self) -> crate::Hello {
        let after = (self.probe_period + self.probe_rtt * 2).min(self.fence_quiet * 3 / 4);
        crate::Hello {
            after,
            again: self.fence_quiet.saturating_sub(after) / 2,
            until: self.fence_quiet,
        }
    }

    /// How long before anyone may take a silent member's IPs over, minus how long before that
    /// member has gone silent: no one declares a member dead before its suspicion runs out nor
    /// answers for it before the takeover hold has passed, and a member cut off is silent once
    /// it has heard nothing for `fence_quiet`.
    pub fn fencing_margin(&self) -> Option<Duration> {
        (self.suspect_to_down + self.takeover_hold).checked_sub(self.fence_quiet)
    }

    /// foca's configuration for a cluster of about `cluster_size` members: these timings, and
    /// its own rule for how many times each change is passed on (it grows with the log of the
    /// size, so every member hears of it).
    pub fn protocol(&self, cluster_size: usize) -> foca::Config {
        let size = NonZeroU32::new(u32::try_from(cluster_size.max(1)).unwrap_or(u32::MAX))
            .expect("at least one member");
        let mut config = foca::Config::new_lan(size);
        config.probe_period = self.probe_period;
        config.probe_rtt = self.probe_rtt;
        config.num_indirect_probes =
            NonZeroUsize::new(self.indirect_probes.max(1)).expect("at least one");
        config.suspect_to_down_after = self.suspect_to_down;
        // foca's own rule passes each change on 4·log10(n+1) times; at 1 % loss that leaves
        // a member now and then without the news of a death (it then learns it only when it
        // probes the dead member itself, which in a large cluster can be minutes away). Half as
        // many again costs a few bytes per change and makes a miss vanishingly rare. Small
        // clusters need a floor: there a suspicion and its refutation cross the suspect's own
        // link with few relays. Three members, one losing 20 % both ways, 4 hours simulated
        // (`examples/lossy_link.rs`): 131 false deaths with foca's floor of 4, 1 with 8, none
        // with 12, which costs nothing above 100 members (where the rule gives 12 anyway).
        let transmissions = (f64::from(size.get()).log10() * 6.0)
            .ceil()
            .clamp(f64::from(MIN_TRANSMISSIONS), 255.0);
        config.max_transmissions = NonZeroU8::new(transmissions as u8).expect("at least the floor");
        config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: self.reannounce_every,
            num_members: NonZeroUsize::new(2).expect("two"),
        });
        config.periodic_gossip = Some(foca::PeriodicParams {
            frequency: self.gossip_every,
            num_members: NonZeroUsize::new(self.gossip_fanout.max(1)).expect("at least one"),
        });
        config
    }
}
