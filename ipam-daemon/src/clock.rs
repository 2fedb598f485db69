//! The daemon's periodic ticks.

/// A tick every `period` for a controller's loop; a tick missed while a pass ran late is not
/// made up in a burst, the next one comes a whole period later.
pub fn ticker(period: std::time::Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}
