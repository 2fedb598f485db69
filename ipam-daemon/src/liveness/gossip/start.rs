//! What the member waits for before it can run: the node records, the cluster key, its own
//! address, its own signing key published in its record, and its socket. Each wait retries with backoff and says what it waits for, in the
//! log and as the fence's reason (`ipamctl members`); none ends the daemon.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use ipam_core::{backoff::Backoff, resources::NodeIpam, store::Watch};
use ipam_gossip::{Keyring, NodeKey};
use tokio::net::UdpSocket;

use super::{Inputs, Outputs, directory::Directory, keys::KeyFiles};
use crate::{
    cluster::{
        ClusterStore,
        cache::{Cache, watch_until_it_works},
    },
    liveness::{
        fence::FenceState,
        own_record::{self, Amended},
    },
};

const RETRY_CAP: Duration = Duration::from_secs(10);

/// Everything the member runs with.
pub(super) struct Started {
    pub socket: UdpSocket,
    pub address: SocketAddr,
    pub keyring: Keyring,
    pub keys: KeyFiles,
    /// This agent's own signing key, its public half in its record.
    pub key: NodeKey,
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
    // Canonical (an IPv4-mapped address as IPv4), as the envelope reads senders: the protocol's
    // own header must name this member as the others read it.
    let address = SocketAddr::new(ip.to_canonical(), inputs.settings.port);
    // The socket first: an agent that cannot have it (its predecessor still stopping, or
    // another agent with this node's name) must not take the record's key over.
    let socket = bind(address, outputs).await;
    let key = NodeKey::generate();
    publish_key(inputs, &key, outputs).await;
    tracing::info!(%address, "gossip listening");
    Started {
        socket,
        address,
        keyring,
        keys,
        key,
        directory,
        records,
    }
}

/// Writes the public half of `key` into this node's record (`spec.gossipKey`), before the
/// first packet signed with it: the others take nothing signed with a key the record does not
/// publish.
async fn publish_key(inputs: &Inputs, key: &NodeKey, outputs: &Outputs) {
    let mut backoff = Backoff::new(RETRY_CAP);
    loop {
        match publish(&inputs.store, &inputs.node, &key.public().to_string()).await {
            Ok(()) => {
                tracing::info!(key = %key.public(), "gossip key published in the node's record");
                return;
            }
            Err(why) => waiting(
                outputs,
                format!(
                    "to publish this agent's gossip key in node {}'s record: {why}",
                    inputs.node
                ),
            ),
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// One attempt at [`publish_key`], also made whenever the record is seen without the key (a
/// writer that does not know the field dropped it).
pub(super) async fn publish(store: &ClusterStore, node: &str, key: &str) -> Result<(), String> {
    let amended = own_record::amend(store, node, |spec| {
        if spec.gossip_key.as_deref() == Some(key) {
            return false;
        }
        spec.gossip_key = Some(key.to_owned());
        true
    })
    .await;
    match amended {
        Ok(Amended::Written | Amended::AlreadySo) => Ok(()),
        Ok(Amended::Raced) => Err("the record changed meanwhile; trying again".into()),
        Ok(Amended::Missing) => Err("the node has no record yet".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Publishes why the node may not answer yet, and logs it when it is news.
fn waiting(outputs: &Outputs, why: String) {
    let state = FenceState::Starting(why.clone());
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
