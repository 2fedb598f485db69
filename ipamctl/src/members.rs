//! `ipamctl members`: the gossip as this node's agent sees it, asked over the local API.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, bail};
use ipam_api::types::{Request, Response};
use ipam_config::Config;

use crate::output::{Output, emit, table};

pub(crate) fn run(config: &Path, socket: Option<&Path>, output: Output) -> anyhow::Result<()> {
    let socket = match socket {
        Some(s) => s.to_owned(),
        None => {
            let config = Config::load(config)?;
            config.node.socket
        }
    };
    let answer = ipam_api::client::call(&socket, &Request::Members, Duration::from_secs(3))
        .with_context(|| format!("asking the agent at {}", socket.display()))?;
    let members = match answer {
        Response::Members(m) => m,
        Response::Error { message, .. } => bail!("{message}"),
        other => bail!("unexpected answer from the agent: {other:?}"),
    };
    emit(output, &members, |m| {
        println!(
            "this node: {} (generation {}), {}",
            m.address.as_deref().unwrap_or("(no address yet)"),
            m.generation,
            match &m.silenced {
                None => "answering for its service IPs".to_owned(),
                Some(why) => format!("responders SILENT: {why}"),
            }
        );
        let mut rows = table(["NODE", "ADDRESS", "GENERATION", "STATE", "LAST HEARD"]);
        for member in &m.members {
            rows.add_row([
                member.node.clone().unwrap_or_else(|| "?".into()),
                member.address.clone(),
                member.generation.to_string(),
                member.state.clone(),
                member
                    .last_heard_ms
                    .map_or_else(|| "never".into(), |ms| format!("{ms} ms ago")),
            ]);
        }
        println!("{rows}");
        if m.members.is_empty() {
            println!("(no other member known)");
        }
        for why in &m.refused {
            println!("REFUSED: {why}");
        }
    })
}
