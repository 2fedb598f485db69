//! The fence as the running member keeps it: `ipam_gossip::Fence` judged after every step, a
//! closing published (and logged, and counted) at once, and a reopening only once the fence has
//! been judged open for `Timing::fence_reopen` without a break (`ipam_gossip::Latch`): a node
//! coming back first learns who is alive, and a minority's last suspicions land.

use std::time::Duration;

use ipam_gossip::{Contact, Fence, Latch, Silenced, Timing, View};
use tokio::sync::watch;

use crate::{
    liveness::fence::FenceState,
    metrics::gossip::{GossipMetrics, ReasonLabel},
};

pub(super) struct FenceKeeper {
    fence: Fence,
    latch: Latch,
    state: watch::Sender<FenceState>,
    /// Whether the fence has been open: a closing after it is `Closed`, one before `Starting`.
    opened: bool,
}

impl FenceKeeper {
    /// The fence of `timing`, held closed until it has been judged open for
    /// `Timing::fence_reopen`.
    pub(super) fn new(timing: &Timing, state: watch::Sender<FenceState>) -> Self {
        Self {
            fence: timing.fence(),
            latch: Latch::new(timing.fence_reopen()),
            state,
            opened: false,
        }
    }

    /// Judges the fence at `now` and publishes a change; whether it reopened (the member then
    /// greets those it holds dead, `ipam_gossip::Peer::greet_the_dead`). While `counted_out`
    /// (this node's own record still says its agent left, `liveness::leave`) it is closed
    /// whatever the gossip says: the others do not count this node, so their majority and
    /// this node's could be two sides of a partition.
    pub(super) fn judge(
        &mut self,
        contact: &Contact,
        now: Duration,
        view: View,
        counted_out: bool,
        metrics: &GossipMetrics,
    ) -> bool {
        let verdict = if counted_out {
            Err(Silenced::CountedOut)
        } else {
            self.fence.judge(contact, now, view)
        };
        let state = match (self.latch.take(now, &verdict), &verdict) {
            (true, _) => FenceState::Open,
            (false, Err(why)) if self.opened => FenceState::Closed(why.to_string()),
            (false, Err(why)) => FenceState::Starting(why.to_string()),
            // Judged open, not yet for long enough: the wakeup comes back for it.
            (false, Ok(())) => return false,
        };
        let opening = state == FenceState::Open;
        self.opened |= opening;
        let changed = self.state.send_if_modified(|current| {
            if *current == state {
                return false;
            }
            match &verdict {
                Ok(()) => {
                    tracing::info!("gossip fence open: this node may answer for its service IPs");
                    metrics.fence_open.set(1);
                }
                Err(why) => {
                    tracing::warn!("gossip fence closed, responders silent: {why}");
                    metrics.fence_open.set(0);
                    let reason = ReasonLabel {
                        reason: silenced_label(why).to_owned(),
                    };
                    metrics.fence_closings.get_or_create(&reason).inc();
                }
            }
            *current = state;
            true
        });
        changed && opening
    }

    /// When the fence must be judged again with nothing else happening: when it would close if
    /// nothing is heard, or when it may reopen.
    pub(super) fn next_judgement(&self, contact: &Contact, now: Duration) -> Option<Duration> {
        let closes = contact
            .heard_ago(now)
            .filter(|ago| *ago < self.fence.quiet)
            .map(|ago| now + (self.fence.quiet - ago) + Duration::from_millis(1));
        closes.into_iter().chain(self.latch.reopens_at()).min()
    }

    /// Why this node may not answer now, if it may not.
    pub(super) fn why_silent(&self) -> Option<String> {
        match &*self.state.borrow() {
            FenceState::Open => None,
            FenceState::Starting(why) | FenceState::Closed(why) => Some(why.clone()),
        }
    }
}

fn silenced_label(why: &Silenced) -> &'static str {
    match why {
        Silenced::NeverHeard => "never_heard",
        Silenced::NothingHeard(_) => "nothing_heard",
        Silenced::ProbesUnanswered { .. } => "probes_unanswered",
        Silenced::DeclaredDead => "declared_dead",
        Silenced::Minority { .. } => "minority",
        Silenced::CountedOut => "counted_out",
    }
}
