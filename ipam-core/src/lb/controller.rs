//! The operator's LB-IPAM controller: reads pools, services, policies and node records from the
//! store, runs the assignment, and writes what changed: each service's IPs and condition, each
//! pool's counts and conditions, and the warning for pools no announced interface reaches.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use super::{
    announce::{announce_problems, unreachable_pools},
    assign::{Assignment, assign_settling},
    bgp::BgpAdvertisement,
    external,
    resources::{
        L2AnnouncementPolicy, LbIpPool, LbIpPoolSpec, LbIpPoolStatus, Namespace, Service,
        ServiceEndpoints, ServiceSpec, ServiceStatus, ServiceType,
    },
    rows,
};

use crate::{
    meta::Condition,
    resources::NodeIpam,
    store::{StoreError, TypedStore, Versioned},
};

pub use super::assign::{ANNOTATIONS_AGREE, ANNOUNCED, LABELS_ACCEPTED, REACHABLE};

/// What a pass changed, for the log.
#[derive(Debug, Default)]
pub struct LbReport {
    /// (service, IPs) whose IPs changed.
    pub assigned: Vec<(String, Vec<std::net::IpAddr>)>,
    /// (object, message) for every service or pool that is not as asked.
    pub problems: Vec<(String, String)>,
    /// Every pool's addresses per family, as this pass counted them.
    pub pool_counts: Vec<(String, Vec<super::resources::LbFamilyCount>)>,
    /// No pool exists, and nothing was written (`reconcile`).
    pub dormant: bool,
    /// The pools changed a moment ago: IPs in no pool are kept until then, when a pass must
    /// run again (`PoolSettling`).
    pub settling_until: Option<Instant>,
    /// More Services' statuses were due than one pass writes (`WRITES_PER_PASS`): another
    /// pass must follow at once.
    pub unfinished: bool,
}

/// How long after the set of pools last changed an IP a Service holds in no pool at all is still
/// kept: pools applied together (`kubectl apply -f` of several) reach the store one by one, a
/// few milliseconds apart; a pass in between must not renumber the Services of the later ones.
pub const POOL_SETTLE: Duration = Duration::from_secs(3);

/// What LB-IPAM remembers between passes: the pools' specs as last seen and when they changed.
#[derive(Debug, Default)]
pub struct PoolSettling {
    seen: Vec<(String, LbIpPoolSpec)>,
    changed_at: Option<Instant>,
    /// The last pass kept IPs in no pool: another is due when the pools have settled.
    settling: bool,
}

impl PoolSettling {
    /// Notes the pools of this pass; until when they settle, if they changed under
    /// `POOL_SETTLE` ago (the first pass counts as a change).
    fn observe(&mut self, pools: &[(String, LbIpPoolSpec)], now: Instant) -> Option<Instant> {
        if self.changed_at.is_none() || pools != self.seen.as_slice() {
            self.seen = pools.to_vec();
            self.changed_at = Some(now);
        }
        let until = self.changed_at? + POOL_SETTLE;
        self.settling = now < until;
        self.settling.then_some(until)
    }

    /// When a pass is due again because the last one ran while the pools settled.
    pub fn awaiting(&self) -> Option<Instant> {
        self.settling
            .then(|| self.changed_at.map(|at| at + POOL_SETTLE))
            .flatten()
    }
}

/// One LB-IPAM pass. Safe to run at any time and as often as wanted.
///
/// Without any pool it writes nothing (`dormant`), as Cilium's LB-IPAM sleeps until its first
/// pool: installed beside another controller, before the migrated pools are applied, it must
/// not take from Services the IPs that controller gave them (docs/migration.md).
pub async fn reconcile<S: TypedStore>(
    store: &S,
    settling: &mut PoolSettling,
) -> Result<LbReport, StoreError> {
    let pools = store.list_typed::<LbIpPool>().await?;
    if pools.is_empty() {
        return Ok(LbReport {
            dormant: true,
            ..LbReport::default()
        });
    }
    let services = store.list_typed::<Service>().await?;
    let policies = store.list_typed::<L2AnnouncementPolicy>().await?;
    let nodes = store.list_typed::<NodeIpam>().await?;
    let endpoints = store.list_typed::<ServiceEndpoints>().await?;
    let namespaces = store.list_typed::<Namespace>().await?;
    let advertisements = store.list_typed::<BgpAdvertisement>().await?;
    let settling_until = settling.observe(&rows::pools(&pools), Instant::now());
    let mut decided = assign_settling(
        &rows::pools_with_status(&pools),
        &rows::services_in(&services, &namespaces),
        settling_until.is_some(),
    );
    let reach = Reach::judge(
        &pools,
        &rows::services_in(&services, &namespaces),
        &policies,
        &nodes,
        &endpoints,
        &advertisements,
        &decided,
    );
    let mut report = LbReport {
        settling_until,
        ..LbReport::default()
    };
    for (policy, message) in &reach.bad_policies {
        report
            .problems
            .push((format!("L2AnnouncementPolicy {policy}"), message.clone()));
    }
    for p in &pools {
        let Some(mut status) = decided.pools.remove(&p.name) else {
            continue;
        };
        reach.pool_conditions(&p.name, &mut status);
        report.note_pool(&p.name, &status);
        if status != p.value.status {
            let mut updated = p.value.clone();
            updated.status = status;
            store
                .update_status_unless_changed(&p.name, &updated, &p.revision)
                .await?;
        }
    }
    let mut writes = Vec::new();
    // A Service LB-IPAM does not serve is told of its refused external IPs by the log and an
    // Event, and by a condition where its status is no other controller's (below).
    for s in services.iter().filter(|s| !s.value.spec.is_ours()) {
        if let Some(problem) = reach.refused.get(&s.name) {
            report
                .problems
                .push((format!("Service {}", s.name), problem.clone()));
        }
    }
    for s in &services {
        let Some(mut status) = decided.services.remove(&s.name) else {
            continue;
        };
        reach.service_conditions(s, &pools, &mut status);
        service_conditions(s, &mut status);
        if status == s.value.status {
            report.note_service(s, &status);
        } else if writes.len() < WRITES_PER_PASS {
            let mut updated = s.value.clone();
            updated.status = status;
            writes.push((s, updated));
        } else {
            // Decided again, from the statuses written meanwhile, by the pass that follows.
            report.unfinished = true;
        }
    }
    // A ClusterIP or NodePort Service has no LB-IPAM status, but its refused external IPs
    // are told on it all the same.
    // One write per Service a pass: one that just left LB-IPAM (it turned ClusterIP) has its
    // status cleared above, and gets the condition on the next pass.
    let written: std::collections::BTreeSet<&str> =
        writes.iter().map(|(s, _)| s.name.as_str()).collect();
    let mut told = Vec::new();
    for s in services
        .iter()
        .filter(|s| !s.value.spec.is_ours() && !written.contains(s.name.as_str()))
    {
        match reach.external_only_status(s) {
            Some(status) if status != s.value.status => {
                if writes.len() + told.len() < WRITES_PER_PASS {
                    let mut updated = s.value.clone();
                    updated.status = status;
                    told.push((s, updated));
                } else {
                    report.unfinished = true;
                }
            }
            _ => {}
        }
    }
    writes.extend(told);
    let until = Instant::now() + WRITING_PER_PASS;
    let issued = write_statuses(store, &writes, until).await?;
    // The others' problems were noted above, whether their status was written or not.
    for (s, updated) in writes[..issued]
        .iter()
        .filter(|(s, _)| s.value.spec.is_ours())
    {
        report.note_service(s, &updated.status);
    }
    report.unfinished |= issued < writes.len();
    Ok(report)
}

/// Whether the IPs can be reached, as this pass judges it: pools no announced subnet reaches,
/// policies that cannot be read, Services no node may answer for. Judged only once there are
/// policies: without any, nothing is announced.
struct Reach {
    judged: bool,
    /// Pool -> why nothing announced reaches it.
    unreachable: BTreeMap<String, String>,
    /// (policy, why it cannot be used).
    bad_policies: Vec<(String, String)>,
    /// Service -> why no node may answer for its IPs.
    unannounced: BTreeMap<String, String>,
    /// Service -> its refused external IPs and why, for the Services an L2 policy or a BGP
    /// advertisement with `externalIPs: true` selects (others list them for kube-proxy alone,
    /// and nothing of this project would announce them anyway).
    refused: BTreeMap<String, String>,
}

impl Reach {
    fn judge(
        pools: &[Versioned<LbIpPool>],
        services: &[(String, ServiceSpec, ServiceStatus)],
        policies: &[Versioned<L2AnnouncementPolicy>],
        nodes: &[Versioned<NodeIpam>],
        endpoints: &[Versioned<ServiceEndpoints>],
        advertisements: &[Versioned<BgpAdvertisement>],
        decided: &Assignment,
    ) -> Self {
        let policy_specs = rows::policies(policies);
        let node_views: Vec<_> = nodes.iter().map(rows::node).collect();
        let labelled = rows::labelled_pools(pools);
        let (unreachable, bad_policies) = unreachable_pools(&labelled, &policy_specs, &node_views);
        // Judged on the statuses this pass decides, so a new IP is judged as it is written.
        let decided_rows: Vec<_> = services
            .iter()
            .map(|(name, spec, status)| {
                let status = decided.services.get(name).unwrap_or(status).clone();
                (name.clone(), spec.clone(), status)
            })
            .collect();
        // The external IPs as every agent judges them, from the same objects.
        let external = external::judge(&decided_rows, &labelled, || {
            external::node_addresses(nodes.iter().map(|n| (n.name.as_str(), &n.value)))
        });
        let unannounced = announce_problems(
            &policy_specs,
            &labelled,
            &external.admitted(&decided_rows),
            &rows::ready_nodes(endpoints),
            &node_views,
        );
        // Told only where this project would announce them: a Service listing them for
        // kube-proxy alone is none of its business.
        let refused = external.problems(&decided_rows, |(service, spec, _)| {
            policy_specs.iter().any(|(_, p)| {
                p.external_ips && p.service_selector.matches_service(service, &spec.labels)
            }) || advertisements.iter().any(|a| {
                let ad = &a.value.spec;
                ad.external_ips && ad.service_selector.matches_service(service, &spec.labels)
            })
        });
        Self {
            judged: !policy_specs.is_empty(),
            unreachable,
            bad_policies,
            unannounced,
            refused,
        }
    }

    /// A pool's `Reachable` condition.
    fn pool_conditions(&self, pool: &str, status: &mut LbIpPoolStatus) {
        if !self.judged {
            return;
        }
        status.conditions.push(match self.unreachable.get(pool) {
            Some(message) => Condition::new(REACHABLE, false, message.clone()),
            None => Condition::new(REACHABLE, true, "inside an announced subnet"),
        });
    }

    /// A Service's `Reachable` (when its IP comes from a pool nothing reaches) and `Announced`
    /// conditions.
    fn service_conditions(
        &self,
        service: &Versioned<Service>,
        pools: &[Versioned<LbIpPool>],
        status: &mut ServiceStatus,
    ) {
        let refused = self.refused.get(&service.name);
        if !self.judged {
            // Advertised over BGP alone: only the external IPs refused are told.
            if let Some(refused) = refused {
                status
                    .conditions
                    .push(Condition::new(ANNOUNCED, false, refused.clone()));
            }
            return;
        }
        // The seed's silent failure made loud: an assigned IP nothing on the link reaches.
        let unreachable_pool = pools.iter().find(|p| {
            self.unreachable.contains_key(&p.name)
                && status.ingress.iter().any(|ip| p.value.spec.contains(*ip))
        });
        if let Some(p) = unreachable_pool {
            status.conditions.push(Condition::new(
                REACHABLE,
                false,
                format!(
                    "its IP comes from pool {}: {}",
                    p.name, self.unreachable[&p.name]
                ),
            ));
        }
        // A Service still without an IP is judged too when an external IP of its is refused.
        let problem = match (self.unannounced.get(&service.name), refused) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b).cloned(),
        };
        if !status.ingress.is_empty() || problem.is_some() {
            status.conditions.push(match problem {
                Some(problem) => Condition::new(ANNOUNCED, false, problem),
                None => Condition::new(ANNOUNCED, true, "a node may answer for its IPs"),
            });
        }
    }
}

impl Reach {
    /// The status of a ClusterIP or NodePort Service: its own, with an `Announced` condition
    /// naming its refused external IPs and why, or without ours once none is. `None` for a
    /// LoadBalancer of another class: its controller owns the status (the log and an Event
    /// tell it).
    fn external_only_status(&self, service: &Versioned<Service>) -> Option<ServiceStatus> {
        if service.value.spec.service_type == ServiceType::LoadBalancer {
            return None;
        }
        let mut status = service.value.status.clone();
        status.conditions.retain(|c| c.kind != ANNOUNCED);
        if let Some(problem) = self.refused.get(&service.name) {
            status
                .conditions
                .push(Condition::new(ANNOUNCED, false, problem.clone()));
        }
        Some(status)
    }
}

/// A Service's conditions about its own spec: annotations that disagree, reserved labels set
/// by hand.
fn service_conditions(service: &Versioned<Service>, status: &mut ServiceStatus) {
    if let Some(conflict) = &service.value.spec.conflict {
        status
            .conditions
            .push(Condition::new(ANNOTATIONS_AGREE, false, conflict.clone()));
    }
    if let Some(ignored) =
        super::resources::reserved_labels_ignored(&service.name, &service.value.spec.labels)
    {
        status
            .conditions
            .push(Condition::new(LABELS_ACCEPTED, false, ignored));
    }
}

impl LbReport {
    /// A pool's counts, and its false conditions but `Conflict` as problems.
    fn note_pool(&mut self, pool: &str, status: &LbIpPoolStatus) {
        for c in status
            .conditions
            .iter()
            .filter(|c| c.kind != "Conflict" && !c.status)
        {
            self.problems
                .push((format!("LoadBalancerIPPool {pool}"), c.message.clone()));
        }
        self.pool_counts
            .push((pool.to_owned(), status.counts.clone()));
    }

    /// A Service's false conditions as problems, and its IPs when they change.
    fn note_service(&mut self, service: &Versioned<Service>, status: &ServiceStatus) {
        for c in status.conditions.iter().filter(|c| !c.status) {
            self.problems
                .push((format!("Service {}", service.name), c.message.clone()));
        }
        if status.ingress != service.value.status.ingress {
            self.assigned
                .push((service.name.clone(), status.ingress.clone()));
        }
    }
}

/// The most Services' statuses one pass writes; the rest are decided again by the next pass,
/// at once. A pass checks the leadership when it starts: 10,000 new Services written in one
/// pass took minutes on an API server that takes 50 writes a second, and the writes went on
/// whether the operator still led or not.
pub const WRITES_PER_PASS: usize = 1024;

/// How long one pass starts new status writes for: well inside the gap between the leader's
/// renewal deadline and another replica's takeover (a third of the operator lease, 5 s by
/// default), so writes begun while leading end before anyone else may lead.
pub const WRITING_PER_PASS: Duration = Duration::from_secs(3);

/// How many Services' status writes are in flight at once. Each waits for the store's commit
/// (an fsync on etcd): one at a time, a burst of 1,000 new Services took 3.5 s to write; a few
/// dozen at once share the commits without flooding the store.
const WRITES_IN_FLIGHT: usize = 32;

/// Writes each Service's new status (unless the Service changed meanwhile: the next pass
/// decides again), `WRITES_IN_FLIGHT` at a time, starting none after `until`; returns how many
/// were started (the first ones), each of them tried, or the first error.
async fn write_statuses<S: TypedStore>(
    store: &S,
    writes: &[(&Versioned<Service>, Service)],
    until: Instant,
) -> Result<usize, StoreError> {
    use futures_util::{StreamExt as _, stream::FuturesUnordered};
    // Filled by hand rather than through a stream combinator's closure: the operator's task
    // must stay `Send`, which rustc cannot prove through such a closure's borrows.
    let mut pending = FuturesUnordered::new();
    let mut next = writes.iter();
    let mut first_error = None;
    let mut issued = 0;
    loop {
        while pending.len() < WRITES_IN_FLIGHT && (issued == 0 || Instant::now() < until) {
            let Some((s, updated)) = next.next() else {
                break;
            };
            issued += 1;
            pending.push(store.update_status_unless_changed(&s.name, updated, &s.revision));
        }
        match pending.next().await {
            Some(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Some(Ok(_)) => {}
            None => break,
        }
    }
    first_error.map_or(Ok(issued), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        lb::resources::{LbIpBlock, LbIpPoolSpec, LbIpPoolStatus, ServiceSpec, ServiceStatus},
        store::embedded::EmbeddedStore,
    };

    /// A pool of `cidrs` that hands out their first and last addresses as `allow_first_last`
    /// says, everything else at its default.
    fn cidr_pool(cidrs: &[&str], allow_first_last: bool) -> LbIpPoolSpec {
        LbIpPoolSpec {
            blocks: cidrs
                .iter()
                .map(|c| LbIpBlock {
                    cidr: Some((*c).to_owned()),
                    ..LbIpBlock::default()
                })
                .collect(),
            allow_first_last_ips: allow_first_last,
            ..LbIpPoolSpec::default()
        }
    }

    /// A Service of tenant-two labelled with tenant-one's namespace, beside a pool for
    /// tenant-one: no IP, and a false `LabelsAccepted` condition naming the reserved label,
    /// which the report carries as a problem (the operator's warning Event and log).
    #[tokio::test]
    async fn a_service_claiming_a_reserved_label_is_refused_and_told_why() {
        let dir = crate::test_util::TempPath::new("lb-controller-labels");
        std::fs::create_dir_all(&*dir).unwrap();
        let store = EmbeddedStore::open(&dir.join("store.redb")).unwrap();
        let mut settling = PoolSettling::default();
        let mut spec = cidr_pool(&["10.9.0.0/28"], false);
        spec.service_selector = serde_json::from_value(serde_json::json!({
            "matchLabels": { "io.kubernetes.service.namespace": "tenant-one" } }))
        .unwrap();
        store
            .create_typed(
                "tenant-one",
                &LbIpPool {
                    labels: Default::default(),
                    spec,
                    status: LbIpPoolStatus::default(),
                },
            )
            .await
            .unwrap();
        let impostor: ServiceSpec = serde_json::from_value(serde_json::json!({
            "type": "LoadBalancer",
            "labels": { "io.kubernetes.service.namespace": "tenant-one" },
        }))
        .unwrap();
        let service = |spec: ServiceSpec| Service {
            spec,
            status: ServiceStatus::default(),
        };
        store
            .create_typed("tenant-two/web", &service(impostor))
            .await
            .unwrap();
        let real: ServiceSpec =
            serde_json::from_value(serde_json::json!({ "type": "LoadBalancer" })).unwrap();
        store
            .create_typed("tenant-one/web", &service(real))
            .await
            .unwrap();
        let report = reconcile(&store, &mut settling).await.unwrap();
        let stored = |name: &'static str| {
            let store = &store;
            async move {
                store
                    .get_typed::<Service>(name)
                    .await
                    .unwrap()
                    .unwrap()
                    .value
            }
        };
        let impostor = stored("tenant-two/web").await;
        assert!(impostor.status.ingress.is_empty(), "{impostor:?}");
        let labels = impostor
            .status
            .conditions
            .iter()
            .find(|c| c.kind == LABELS_ACCEPTED)
            .expect("the LabelsAccepted condition");
        assert!(
            !labels.status
                && labels
                    .message
                    .contains("io.kubernetes.service.namespace=tenant-one")
                && labels.message.contains("reserved"),
            "{labels:?}"
        );
        assert!(
            report
                .problems
                .iter()
                .any(|(o, p)| o == "Service tenant-two/web" && p.contains("reserved")),
            "{:?}",
            report.problems
        );
        assert_eq!(stored("tenant-one/web").await.status.ingress.len(), 1);
    }

    /// A Service whose annotations disagree keeps getting its IP (the first annotation in
    /// precedence decides) and carries a false `AnnotationsAgree` condition naming both; the
    /// condition goes once they agree.
    #[tokio::test]
    async fn a_service_whose_annotations_disagree_is_told_and_still_served() {
        let dir = crate::test_util::TempPath::new("lb-controller");
        std::fs::create_dir_all(&*dir).unwrap();
        let store = EmbeddedStore::open(&dir.join("store.redb")).unwrap();
        let mut settling = PoolSettling::default();
        let pool = LbIpPool {
            labels: Default::default(),
            spec: cidr_pool(&["10.9.0.0/28"], false),
            status: LbIpPoolStatus::default(),
        };
        store.create_typed("lb", &pool).await.unwrap();
        let mut spec: ServiceSpec = serde_json::from_value(serde_json::json!({
            "type": "LoadBalancer",
            "conflict": "annotations a (1) and b (2) disagree",
        }))
        .unwrap();
        let service = Service {
            spec: spec.clone(),
            status: ServiceStatus::default(),
        };
        store.create_typed("ns/web", &service).await.unwrap();
        let report = reconcile(&store, &mut settling).await.unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|(o, p)| o == "Service ns/web" && p.contains("disagree")),
            "{:?}",
            report.problems
        );
        let stored = store.get_typed::<Service>("ns/web").await.unwrap().unwrap();
        assert_eq!(stored.value.status.ingress.len(), 1, "served all the same");
        let agree = |s: &Service| {
            s.status
                .conditions
                .iter()
                .find(|c| c.kind == ANNOTATIONS_AGREE)
                .map(|c| c.status)
        };
        assert_eq!(agree(&stored.value), Some(false));
        spec.conflict = None;
        let mut fixed = stored.value.clone();
        fixed.spec = spec;
        store
            .update_typed("ns/web", &fixed, &stored.revision)
            .await
            .unwrap();
        reconcile(&store, &mut settling).await.unwrap();
        let stored = store.get_typed::<Service>("ns/web").await.unwrap().unwrap();
        assert_eq!(agree(&stored.value), None);
        assert_eq!(
            stored.value.status.ingress, fixed.status.ingress,
            "the IP kept"
        );
    }

    /// Without any pool nothing is written: a Service keeps the IP another controller gave it
    /// (a migration installs this project before applying the converted pools); the first
    /// pool that holds the IP wakes LB-IPAM, and the Service keeps it.
    #[tokio::test]
    async fn without_a_pool_nothing_is_written_and_the_first_pool_keeps_held_ips() {
        let dir = crate::test_util::TempPath::new("lb-dormant");
        std::fs::create_dir_all(&*dir).unwrap();
        let store = EmbeddedStore::open(&dir.join("store.redb")).unwrap();
        let mut settling = PoolSettling::default();
        let held: Vec<std::net::IpAddr> =
            vec!["10.9.0.0".parse().unwrap(), "fd09::7".parse().unwrap()];
        let spec: ServiceSpec = serde_json::from_value(serde_json::json!({
            "type": "LoadBalancer",
            "ipFamilyPolicy": "RequireDualStack",
        }))
        .unwrap();
        let service = Service {
            spec,
            status: ServiceStatus {
                ingress: held.clone(),
                conditions: Vec::new(),
            },
        };
        let created = store.create_typed("ns/web", &service).await.unwrap();
        let report = reconcile(&store, &mut settling).await.unwrap();
        assert!(report.dormant);
        let stored = store.get_typed::<Service>("ns/web").await.unwrap().unwrap();
        assert_eq!(stored.revision, created, "nothing written without a pool");

        let pool = LbIpPool {
            labels: Default::default(),
            spec: cidr_pool(&["10.9.0.0/28", "fd09::/124"], true),
            status: LbIpPoolStatus::default(),
        };
        store.create_typed("migrated", &pool).await.unwrap();
        let report = reconcile(&store, &mut settling).await.unwrap();
        assert!(!report.dormant);
        let stored = store.get_typed::<Service>("ns/web").await.unwrap().unwrap();
        assert_eq!(
            stored.value.status.ingress, held,
            "{:?}",
            stored.value.status
        );
    }

    /// While the pools settle, an IP in no pool at all is kept (its pool may be the next one
    /// applied); after, it is given up with the reason.
    #[test]
    fn an_ip_in_no_pool_is_kept_while_the_pools_settle() {
        use crate::lb::assign::{assign, assign_settling};
        let pool = |cidr: &str| cidr_pool(&[cidr], true);
        for (first, later) in [("10.9.0.0/28", "10.9.1.0"), ("fd09::/124", "fd09:1::")] {
            let pools = vec![("first".to_owned(), pool(first), LbIpPoolStatus::default())];
            let spec: ServiceSpec =
                serde_json::from_value(serde_json::json!({"type": "LoadBalancer"})).unwrap();
            let held: std::net::IpAddr = later.parse().unwrap();
            let mut spec_v6 = spec.clone();
            if held.is_ipv6() {
                spec_v6.ip_families = vec![crate::Family::V6];
            }
            let services = vec![(
                "ns/late".to_owned(),
                spec_v6,
                ServiceStatus {
                    ingress: vec![held],
                    conditions: Vec::new(),
                },
            )];
            let kept = assign_settling(&pools, &services, true);
            assert_eq!(kept.services["ns/late"].ingress, vec![held]);
            let after = assign(&pools, &services);
            assert_ne!(after.services["ns/late"].ingress, vec![held]);
            assert!(
                after.services["ns/late"].conditions[0]
                    .message
                    .contains(&format!("gave up {held}")),
                "{:?}",
                after.services["ns/late"]
            );
        }

        let mut settling = PoolSettling::default();
        let t0 = Instant::now();
        let a = vec![("a".to_owned(), pool("10.9.0.0/28"))];
        assert_eq!(
            settling.observe(&a, t0),
            Some(t0 + POOL_SETTLE),
            "the first pass"
        );
        let later = t0 + POOL_SETTLE;
        assert_eq!(settling.observe(&a, later), None, "settled");
        let mut b = a.clone();
        b.push(("b".to_owned(), pool("10.9.1.0/28")));
        assert_eq!(
            settling.observe(&b, later),
            Some(later + POOL_SETTLE),
            "a pool added"
        );
    }
}
