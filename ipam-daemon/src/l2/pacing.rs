//! The pace of the ownership decisions, which every node runs alike, and which the hand-over
//! between live nodes is timed by: below both `owners`, which keeps it, and `handover`, which
//! waits for the slowest node it allows.

use std::time::Duration;

/// How often ownership is decided again when something changed (a burst of changes costs
/// one decision per tick), or while time alone may change it (lease lapses, which change
/// nothing in the store to wake us; a hand-over's wait). A change of the gossip's membership
/// is decided at once; at rest, with the gossip, nothing is decided.
pub const TICK: Duration = Duration::from_millis(100);
/// A tick decides again only after resting `DUTY - 1` times as long as the last decision took
/// (at most [`MAX_REST`]): the decisions take at most a `DUTY`th of a core. A death or a
/// return in the gossip is decided at once all the same.
pub const DUTY: u32 = 10;
/// The longest decision the hand-over between live nodes is timed for (`handover::HANDOVER`):
/// a few times what one takes at 10,000 Services. A longer one is logged as a warning.
pub const DECISION: Duration = Duration::from_millis(50);
/// The longest rest between two decisions, `DUTY - 1` times [`DECISION`]. The old owner of an
/// IP lets go at its next decision, after its rest; the new owner, which cannot see the old
/// one's pace, waits for the longest rest any node takes. Unbounded, the rest of a slower node
/// (nine times its last decision) outgrew that wait, and the old owner let go after the new
/// one answered. Decisions up to [`DECISION`] still take at most a `DUTY`th of a core.
pub const MAX_REST: Duration =
    Duration::from_millis(DECISION.as_millis() as u64 * (DUTY as u64 - 1));

/// How long to rest after a decision that took `decision`: `DUTY - 1` times as long, so the
/// decisions take a `DUTY`th of a core, but never more than [`MAX_REST`], which the new owner
/// of an IP waits for (`handover::HANDOVER`) before answering in place of this node.
pub fn rest_after(decision: Duration) -> Duration {
    (decision * (DUTY - 1)).min(MAX_REST)
}
