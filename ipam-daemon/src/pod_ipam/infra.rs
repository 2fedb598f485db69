//! The node's infrastructure addresses (router, health, ingress) as the IPAM pass allocated
//! them, shared with the API, which hands the router address to pods as their gateway.

use std::{collections::BTreeMap, net::IpAddr, sync::atomic::Ordering};

use ipam_common::Family;
use ipam_core::{
    backoff::Backoff,
    pod::{
        infra::{INFRA_RETRY_CAP, allocate_waiting},
        node::{HEALTH_OWNER, INGRESS_OWNER, ROUTER_OWNER},
    },
};

use super::PodIpam;

/// The node's router and health addresses, and what their allocation waits for.
#[derive(Debug, Clone, Default)]
pub struct InfraState {
    pub(super) addresses: BTreeMap<String, BTreeMap<Family, IpAddr>>,
    pub(super) waiting: Option<String>,
}

impl PodIpam {
    /// Allocates the router, health (and ingress) addresses, one task per family, waiting for
    /// a block where there is none yet.
    pub(super) fn spawn_infra(&self) {
        let mut purposes = vec![ROUTER_OWNER, HEALTH_OWNER];
        if self.settings.ingress {
            purposes.push(INGRESS_OWNER);
        }
        // One task per family, router first: in a fresh block the router (the pods' gateway)
        // gets the first usable address, as users expect.
        let own = &self.agents.by_pool[&self.settings.infra_pool];
        for family in self.settings.families.clone() {
            let alloc = own.allocator();
            let demand = own.demand();
            let infra = self.infra.clone();
            let pool = self.settings.infra_pool.clone();
            let purposes = purposes.clone();
            tokio::spawn(async move {
                for purpose in purposes {
                    let mut backoff = Backoff::new(INFRA_RETRY_CAP);
                    let ask = demand.clone();
                    let waiting = infra.clone();
                    let pool = pool.clone();
                    let result = allocate_waiting(
                        purpose,
                        family,
                        || alloc.allocate(purpose, family),
                        || {
                            ask.store(true, Ordering::SeqCst);
                            waiting.lock().expect("infra lock").waiting = Some(format!(
                                "{purpose} {} address: waiting for a block of pool {pool}",
                                family.name()
                            ));
                        },
                        &mut backoff,
                    )
                    .await;
                    let mut state = infra.lock().expect("infra lock");
                    match result {
                        Ok(ip) => {
                            demand.store(false, Ordering::SeqCst);
                            tracing::info!(purpose, %ip, "{} {purpose} address ready", family.name());
                            state
                                .addresses
                                .entry(purpose.to_owned())
                                .or_default()
                                .insert(family, ip);
                            state.waiting = None;
                        }
                        Err(e) => {
                            tracing::error!(
                                purpose,
                                "cannot allocate the {} {purpose} address: {e}",
                                family.name()
                            );
                            state.waiting = Some(format!("{purpose} {}: {e}", family.name()));
                        }
                    }
                }
            });
        }
    }
}
