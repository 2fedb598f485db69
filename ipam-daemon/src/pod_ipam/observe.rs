//! The node's IPAM gauges, the datapath's counters, and the pod network's readiness check.

use std::net::IpAddr;

use ipam_core::Family;

use super::PodIpam;

impl PodIpam {
    /// Brings the gauges and the datapath's counters up to date, and the pod network check.
    pub(super) fn observe(&self) {
        use std::sync::atomic::Ordering;

        use crate::metrics::FamilyState;
        let m = &self.observed.metrics;
        for family in [Family::V4, Family::V6] {
            let (used, free) = self
                .agents
                .by_pool
                .values()
                .fold((0, 0), |(used, free), agent| {
                    agent
                        .allocator()
                        .with(|a| (used + a.allocated(family) as u64, free + a.free(family)))
                });
            let label = |state: &str| FamilyState {
                family: family.name().to_owned(),
                state: state.to_owned(),
            };
            m.node_addresses
                .get_or_create(&label("capacity"))
                .set((used + free) as i64);
            m.node_addresses
                .get_or_create(&label("used"))
                .set(used as i64);
            m.node_addresses
                .get_or_create(&label("available"))
                .set(free as i64);
        }
        m.block_requests_pending.set(i64::from(self.demand()));
        for pool in &self.status.pools {
            m.set_pool_usage(&pool.name, &pool.usage);
        }
        if let Ok(mut dp) = self.datapath.lock() {
            if let Ok(stats) = dp.pods().stats() {
                for stat in ipam_common::pod::PodStat::ALL {
                    m.pod_counter_total(stat.name(), stats.get(stat));
                }
            }
            if let Ok(entries) = dp.responder().list() {
                let mut by_ip: std::collections::BTreeMap<IpAddr, u64> = Default::default();
                for e in entries {
                    *by_ip.entry(e.ip).or_default() += e.replies;
                }
                for (ip, replies) in by_ip {
                    m.l2_replies_total(ip, replies);
                }
            }
        }
        let gateway = self.host.gateway_ready().load(Ordering::SeqCst);
        self.observed.health.set(
            "pod network",
            if gateway {
                Ok(())
            } else {
                Err(self
                    .infra
                    .lock()
                    .expect("infra lock")
                    .waiting
                    .clone()
                    .unwrap_or_else(|| {
                        "the router addresses are not on the host device yet".into()
                    }))
            },
        );
    }
}
