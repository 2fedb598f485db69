//! The responders' heartbeat: the XDP responders answer only while the heartbeat they read is
//! younger than `liveness_timeout`. The daemon writes it every `heartbeat_interval`, and on a
//! shared store only while the fence allows, so a node cut off from the store goes silent
//! before any other node may take its IPs over.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::watch;

use super::Fence;
use crate::datapath::Datapath;

/// How often to beat, and for how long each beat keeps the responders answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub interval: Duration,
    pub liveness_timeout: Duration,
}

/// Beats for the life of the daemon. `timing` follows configuration reloads.
pub async fn run(
    datapath: Arc<Mutex<Datapath>>,
    fence: Option<Arc<Fence>>,
    mut timing: watch::Receiver<Timing>,
) {
    let mut current = *timing.borrow_and_update();
    let mut tick = crate::clock::ticker(current.interval);
    let mut silenced = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = timing.changed() => {
                if changed.is_err() {
                    return;
                }
                current = *timing.borrow_and_update();
                tick = crate::clock::ticker(current.interval);
                continue;
            }
        }
        if let Some(fence) = &fence
            && !fence.may_answer()
        {
            if !silenced {
                tracing::warn!("node lease not renewed in time: responders go silent until it is");
                silenced = true;
            }
            continue;
        }
        if std::mem::take(&mut silenced) {
            tracing::info!("node lease renewed: responders answer again");
        }
        let beat = datapath
            .lock()
            .expect("datapath lock")
            .heartbeat(current.liveness_timeout);
        if let Err(e) = beat {
            tracing::error!("cannot write heartbeat, responders will go silent: {e}");
        }
    }
}
