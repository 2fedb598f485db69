//! The responders' heartbeat: the XDP responders answer only while the heartbeat they read is
//! younger than `liveness_timeout`. The daemon writes it every `heartbeat_interval`, and on a
//! shared store only while the fence allows; when the fence closes it silences the responders
//! at once rather than let the last beat run out, so a node cut off goes silent before any
//! other node may take its IPs over.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use ipam_datapath::Datapath;
use tokio::sync::watch;

use super::Fence;

/// Waits for the fence to change, or forever without one.
async fn fence_changed(fence: Option<&mut Fence>) {
    match fence {
        Some(fence) => fence.changed().await,
        None => std::future::pending().await,
    }
}

/// How often to beat, and for how long each beat keeps the responders answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub interval: Duration,
    pub liveness_timeout: Duration,
}

/// Beats for the life of the daemon. `timing` follows configuration reloads.
pub async fn run(
    datapath: Arc<Mutex<Datapath>>,
    mut fence: Option<Fence>,
    mut timing: watch::Receiver<Timing>,
) {
    let mut current = *timing.borrow_and_update();
    let mut tick = crate::clock::ticker(current.interval);
    let mut silenced = false;
    // Until the fence first opens (the agent starting), a closed fence neither beats nor
    // silences: the responders answer until the deadline the previous agent left, which is
    // long past after a crash, and the end of its promise after a stop for a restart
    // (`liveness::restart`), which the other nodes keep to as well.
    let mut opened_once = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = fence_changed(fence.as_mut()) => {}
            changed = timing.changed() => {
                if changed.is_err() {
                    return;
                }
                current = *timing.borrow_and_update();
                tick = crate::clock::ticker(current.interval);
                continue;
            }
        }
        if let Some(why) = fence.as_ref().and_then(Fence::why_silent) {
            if !opened_once {
                continue;
            }
            if !silenced {
                silenced = true;
                let silence = datapath.lock().expect("datapath lock").silence();
                match silence {
                    Ok(()) => {
                        tracing::warn!("responders go silent until this node may answer: {why}");
                    }
                    Err(e) => tracing::error!(
                        "cannot silence the responders ({why}); they fall silent when the last \
                         heartbeat runs out: {e}"
                    ),
                }
            }
            continue;
        }
        opened_once = true;
        if std::mem::take(&mut silenced) {
            tracing::info!("this node may answer again: responders answer");
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
