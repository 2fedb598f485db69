//! `ipamctl who-has <IP>`: the local node's view, then the cluster store's when the
//! configuration names one; it says what it read.

mod find;

use std::{net::IpAddr, path::PathBuf};

use ipam_config::Config;
use ipam_store::AnyStore;
use serde::Serialize;

use crate::output::{Output, emit};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    ip: IpAddr,
    /// Where the answer comes from: this node's state directory, the cluster store.
    read: Vec<String>,
    findings: Vec<find::Finding>,
}

pub(crate) fn run(
    ip: IpAddr,
    state_dir: PathBuf,
    config: Option<&Config>,
    output: Output,
) -> anyhow::Result<()> {
    let mut read = vec![format!("this node's state under {}", state_dir.display())];
    let mut findings = find::local(ip, &state_dir);
    if let Some(c) = config.filter(|c| c.store.kind.is_shared()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let s = AnyStore::open(&c.store_settings()).await?;
            read.push(s.describe());
            for f in find::cluster(&s, ip).await? {
                if !findings.contains(&f) {
                    findings.push(f);
                }
            }
            Ok::<_, anyhow::Error>(())
        })?;
    }
    let answer = Answer { ip, read, findings };
    emit(output, &answer, |a| {
        if a.findings.is_empty() {
            println!("{ip}: nobody has it, and no pool holds it");
        }
        for f in &a.findings {
            println!("{ip}: {f}");
        }
        println!("(read: {})", a.read.join("; "));
    })
}
