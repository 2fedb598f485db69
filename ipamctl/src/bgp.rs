//! `ipamctl bgp`: every BGP session of the cluster, one row per peer and node, from the
//! BGPPeers' status (each agent writes its own sessions there when they change).

use ipam_core::{lb::bgp::BgpPeer, store::TypedStore as _};
use ipam_store::AnyStore;
use serde::Serialize;

use crate::output::{Output, emit, table};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SessionRow {
    peer: String,
    address: String,
    peer_asn: u32,
    node: String,
    state: String,
    routes_advertised: u32,
    /// Why the session is not established, when it is not.
    reason: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct View {
    read: String,
    sessions: Vec<SessionRow>,
    /// Peers no node reported a session for yet (no node selected, or no agent with `[bgp]`).
    without_sessions: Vec<String>,
}

pub(crate) async fn run(store: &AnyStore, output: Output) -> anyhow::Result<()> {
    let peers = store.list_typed::<BgpPeer>().await?;
    let mut view = View {
        read: store.describe(),
        sessions: Vec::new(),
        without_sessions: Vec::new(),
    };
    for p in &peers {
        if p.value.status.nodes.is_empty() {
            view.without_sessions.push(p.name.clone());
        }
        for n in &p.value.status.nodes {
            view.sessions.push(SessionRow {
                peer: p.name.clone(),
                address: p.value.spec.peer_address.to_string(),
                peer_asn: p.value.spec.peer_asn,
                node: n.node.clone(),
                state: n.state.clone(),
                routes_advertised: n.routes_advertised,
                reason: n.reason.clone(),
            });
        }
    }
    emit(output, &view, |view| {
        let mut rows = table([
            "PEER", "ADDRESS", "ASN", "NODE", "STATE", "ROUTES", "WHY DOWN",
        ]);
        for s in &view.sessions {
            rows.add_row([
                s.peer.clone(),
                s.address.clone(),
                s.peer_asn.to_string(),
                s.node.clone(),
                s.state.clone(),
                s.routes_advertised.to_string(),
                s.reason.clone(),
            ]);
        }
        println!("{rows}");
        for peer in &view.without_sessions {
            println!(
                "BGPPeer {peer}: no node reports a session; check its nodeSelector and that the \
                 agents have a [bgp] section"
            );
        }
        println!(
            "(read from {}; the agents write each change of a session)",
            view.read
        );
    })
}
