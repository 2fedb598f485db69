//! What a receiver keeps of each sender to drop replays, in a fixed size per sender.

use super::{Dropped, REPLAY_WINDOW};

/// The counters seen from one sender: the highest, and which of the [`REPLAY_WINDOW`] below it
/// (bit `k - 1` of `below` is the counter `highest - k`); and when (the receiver's clock) the
/// last packet was taken from it. A fixed size per sender, whatever it sends.
#[derive(Debug, Default)]
pub(super) struct ReplayWindow {
    highest: u64,
    below: u64,
    last_taken: u64,
}

impl ReplayWindow {
    /// Takes `counter`, received at `unix_micros`, unless it was seen or is too old to tell.
    pub(super) fn admit(&mut self, counter: u64, unix_micros: u64) -> Result<(), Dropped> {
        self.check_and_mark(counter)?;
        self.last_taken = self.last_taken.max(unix_micros);
        Ok(())
    }

    /// Whether a packet was taken from this sender within `span` before `unix_micros`.
    pub(super) fn taken_within(&self, unix_micros: u64, span: u64) -> bool {
        unix_micros.saturating_sub(self.last_taken) <= span
    }

    fn check_and_mark(&mut self, counter: u64) -> Result<(), Dropped> {
        if counter > self.highest {
            let shift = counter - self.highest;
            // The old highest becomes bit `shift - 1`; past the window it falls out, with
            // everything below it.
            self.below = if shift > REPLAY_WINDOW {
                0
            } else {
                let shifted = u32::try_from(shift)
                    .ok()
                    .and_then(|s| self.below.checked_shl(s))
                    .unwrap_or(0);
                shifted | (1 << (shift - 1))
            };
            self.highest = counter;
            return Ok(());
        }
        let back = self.highest - counter;
        if back == 0 || back > REPLAY_WINDOW {
            return Err(Dropped::Replayed);
        }
        let bit = 1 << (back - 1);
        if self.below & bit != 0 {
            return Err(Dropped::Replayed);
        }
        self.below |= bit;
        Ok(())
    }
}
