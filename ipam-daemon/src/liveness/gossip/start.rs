//! What the member waits for before it can run: the node records, the cluster key, its own
//! address and its socket. Each wait retries with backoff and says what it waits for, in the
//! log and as the fence's reason (`ipamctl members`); none ends the daemon.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use ipam_core::{backoff::Backoff, resources::NodeIpam, store::Watch};
use ipam_gossip::Keyring;
use tokio::net::UdpSocket;

use super::{Inputs, Outputs, directory::Directory, keys::KeyFiles};
use crate::{
    cluster::cache::{Cache, watch_until_it_works},
    liveness::fence::FenceState,
};

const RETRY_CAP: Duration = Duration::from_secs(10);

/// Everything the member runs with.
pub(super) struct Started {
    pub socket: UdpSocket,
    pub address: SocketAddr,
    pub keyring: Keyring,
    pub keys: KeyFiles,
    pub directory: Directory,
    pub records: Watch,
}

pub(super) async fn start(inputs: &Inputs, outputs: &Outputs) -> Started {
    let mut records = watch_until_it_works::<NodeIpam, _>(&inputs.store, "the gossip").await;
    let mut directory = Directory::new(
        &inputs.node,
        inputs.settings.port,
        Cache::new(&records.initial),
    );
    let mut keys = KeyFiles::new(&inputs.settings);
    let keyring = load_keys(&mut keys, outputs).await;
    let ip = own_address(inputs, &mut directory, &mut records, outputs).await;
    let address = SocketAddr::new(ip, inputs.settings.port);
    let socket = bind(address, outputs).await;
    tracing::info!(%address, "gossip listening");
    Started {
        socket,
        address,
        keyring,
        keys,
        directory,
        records,
    }
}

/// Publishes why the node may not answer yet, and logs it when it is news.
fn waiting(outputs: &Outputs, why: String) {
    let state = FenceState::Closed(why.clone());
    if *outputs.fence.borrow() != state {
        tracing::warn!("gossip waiting: {why}");
        outputs.fence.send_replace(state);
    }
}

async fn load_keys(keys: &mut KeyFiles, outputs: &Outputs) -> Keyring {
    let mut backoff = Backoff::new(RETRY_CAP);
    loop {
        match keys.reload() {
            Ok(Some(keyring)) => return keyring,
            Ok(None) => unreachable!("the first read always yields a keyring"),
            Err(e) => waiting(outputs, format!("for the cluster key: {e}")),
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// The configured address, else the first address of this node's record (written by the pod
/// IPAM controller once it knows it).
async fn own_address(
    inputs: &Inputs,
    directory: &mut Directory,
    records: &mut Watch,
    outputs: &Outputs,
) -> IpAddr {
    if let Some(ip) = inputs.settings.address {
        return ip;
    }
    loop {
        if let Some(ip) = directory.own_address() {
            return ip;
        }
        waiting(
            outputs,
            format!(
                "for node {}'s record to list its address (or set [gossip] address)",
                inputs.node
            ),
        );
        directory.apply(records.next().await);
    }
}

async fn bind(address: SocketAddr, outputs: &Outputs) -> UdpSocket {
    let mut backoff = Backoff::new(RETRY_CAP);
    loop {
        match UdpSocket::bind(address).await {
            Ok(socket) => return socket,
            Err(e) => waiting(
                outputs,
                format!(
                    "to listen for gossip on UDP {address}: {e} (is the address on this node, \
                     and the port free?)"
                ),
            ),
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}
