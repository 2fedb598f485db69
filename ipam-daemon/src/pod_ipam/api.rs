//! Pod addresses over the local API: what `ipam-cni` ADD, DEL, CHECK, GC and STATUS land on in
//! the daemon. Allocations are keyed by the CNI attachment (container id and interface).

use std::{
    net::IpAddr,
    sync::{Arc, Mutex, atomic::AtomicBool},
};

use ipam_api::types::{AllocatedIp, AttachmentId, ErrorCode, Request, Response};
use ipam_core::{
    Family,
    pod::{
        durable::DurableError,
        fixed,
        multipool::PoolSource,
        node::{AllocError, ROUTER_OWNER},
    },
};

use super::{
    infra::InfraState,
    pools::{PodPools, PoolAllocator},
};
use crate::endpoints::{EndpointError, Endpoints};

/// Pod allocations served over the API.
pub(super) struct PodAllocations {
    pub(super) pools: Arc<PodPools>,
    pub(super) infra: Arc<Mutex<InfraState>>,
    pub(super) families: Vec<Family>,
    pub(super) endpoints: Arc<Endpoints>,
    /// The host device holds the router addresses (see `host_network`).
    pub(super) gateway_ready: Arc<AtomicBool>,
    pub(super) host_device: String,
    pub(super) metrics: Arc<crate::metrics::Metrics>,
}

/// A response as a metric's result label: `ok`, or the error code (a bounded set).
fn outcome(response: &Response) -> &'static str {
    match response {
        Response::Error { code, .. } => code.name(),
        _ => "ok",
    }
}

/// The API's answer for an endpoint failure: a claim of someone else's address is the
/// caller's mistake, everything else a failure on this node.
fn endpoint_error(e: EndpointError) -> Response {
    let code = match e {
        EndpointError::NotAllocated { .. } => ErrorCode::BadRequest,
        _ => ErrorCode::Failed,
    };
    Response::error(code, e.to_string())
}

impl PodAllocations {
    pub(super) fn handle(&self, request: Request) -> Response {
        if let Some(failed) = self.adopt_legacy(&request) {
            return failed;
        }
        match request {
            Request::Allocate(a) => {
                let response = self.allocate(&a.id, a.pod.as_deref(), a.pool.as_deref(), &a.ips);
                crate::metrics::Metrics::result(&self.metrics.pod_allocations, outcome(&response));
                response
            }
            Request::Release(a) => {
                let response = self.release(&a.id);
                crate::metrics::Metrics::result(&self.metrics.pod_releases, outcome(&response));
                response
            }
            Request::Check(a) => match self.held(&a.id) {
                ips if ips.is_empty() => Response::error(
                    ErrorCode::Unknown,
                    format!(
                        "container {} interface {} has no address on this node",
                        a.id.container_id, a.id.ifname
                    ),
                ),
                ips => Response::Checked { ips },
            },
            Request::Gc { network, valid } => self.collect(&network, &valid),
            Request::Status => match self.not_ready() {
                Some(why) => Response::error(ErrorCode::NotReady, why),
                None => Response::Ready,
            },
            Request::RegisterEndpoint(endpoint) => {
                let held: Vec<IpAddr> = self.held(&endpoint.id).iter().map(|i| i.address).collect();
                match self.endpoints.register(endpoint, &held) {
                    Ok(()) => Response::Registered,
                    Err(e) => endpoint_error(e),
                }
            }
            Request::RemoveEndpoint(id) => match self.endpoints.remove(&id) {
                Ok(endpoint) => Response::EndpointRemoved { endpoint },
                Err(e) => endpoint_error(e),
            },
            Request::Endpoints => match self.endpoints.stats() {
                Ok(stats) => Response::Endpoints {
                    endpoints: self.endpoints.list(),
                    stats,
                },
                Err(e) => Response::error(ErrorCode::Failed, e.to_string()),
            },
            // Answered by the gossip when it runs (see `liveness::gossip::api_handler`).
            Request::Members => Response::error(
                ErrorCode::BadRequest,
                "this node does not gossip ([gossip] is not in its configuration): it learns \
                 who is alive from the nodes' leases in the store",
            ),
        }
    }

    fn router(&self, family: Family) -> Option<IpAddr> {
        let state = self.infra.lock().expect("infra lock");
        state
            .addresses
            .get(ROUTER_OWNER)
            .and_then(|m| m.get(&family))
            .copied()
    }

    /// Why pods cannot get addresses yet, if they cannot.
    fn not_ready(&self) -> Option<String> {
        let missing: Vec<&str> = self
            .families
            .iter()
            .filter(|f| self.router(**f).is_none())
            .map(|f| f.name())
            .collect();
        if missing.is_empty() {
            if !self.gateway_ready.load(std::sync::atomic::Ordering::SeqCst) {
                return Some(format!(
                    "ipamd is not ready: host device {} does not hold the router addresses yet; \
                     try again later (ipamd's log says what it waits for)",
                    self.host_device
                ));
            }
            return None;
        }
        let waiting = self.infra.lock().expect("infra lock").waiting.clone();
        Some(format!(
            "ipamd is not ready: the node has no {} router address yet ({}); try again later",
            missing.join(" and "),
            waiting.unwrap_or_else(|| format!("waiting for a block of pool {}", self.pools.own()))
        ))
    }

    fn describe(&self, alloc: &PoolAllocator, ip: IpAddr) -> AllocatedIp {
        let family = Family::of(ip);
        let prefix_len = alloc.alloc.with(|a| {
            a.blocks(family)
                .iter()
                .find(|b| b.contains(ip))
                .map_or(family.bits(), ipam_core::Cidr::prefix)
        });
        AllocatedIp {
            family,
            address: ip,
            prefix_len,
            gateway: self.router(family),
        }
    }

    fn allocate(
        &self,
        id: &AttachmentId,
        pod: Option<&str>,
        network_pool: Option<&str>,
        asked: &[IpAddr],
    ) -> Response {
        if let Some(why) = self.not_ready() {
            return Response::error(ErrorCode::NotReady, why);
        }
        let owner = id.owner();
        let who = pod.map_or_else(
            || format!("container {}", id.container_id),
            |p| format!("pod {p}"),
        );
        let requested = match self.requested(&who, pod, asked) {
            Ok(requested) => requested,
            Err((code, why)) => return Response::error(code, why),
        };
        // A repeated ADD (one family was served, the other waited for a block) stays in the
        // pool the attachment already holds an address of, whatever the annotations say now.
        let holding = self.pools.all().into_iter().find(|(_, a)| {
            [Family::V4, Family::V6]
                .into_iter()
                .any(|f| a.alloc.with(|x| x.lookup(&owner, f)).is_some())
        });
        let chosen = match holding {
            Some((pool, _)) => Ok((pool, PoolSource::Held)),
            None => self.pools.choose(&who, pod, network_pool),
        };
        let (pool, source) = match chosen {
            Ok(chosen) => chosen,
            Err(why) => return Response::error(ErrorCode::NotReady, why.0),
        };
        let Some(alloc) = self.pools.allocator(&pool) else {
            return Response::error(
                ErrorCode::NotReady,
                format!(
                    "{who}: pool {pool} (from the {}) has no block on this node yet; requested \
                     one, try again later",
                    source.name()
                ),
            );
        };
        if !requested.is_empty() {
            if let Err((code, why)) = self.pools.check_tenancy(&who, pod, &pool, &requested) {
                return Response::error(code, why);
            }
            return self.allocate_requested(&who, &owner, &pool, &alloc, &requested);
        }
        let mut ips = Vec::new();
        for family in &self.families {
            match alloc.alloc.allocate(&owner, *family) {
                Ok(ip) => ips.push(self.describe(&alloc, ip)),
                Err(DurableError::Alloc(
                    e @ (AllocError::NoBlock { .. } | AllocError::Full { .. }),
                )) => {
                    // Ask for a block; the runtime retries the ADD (CNI code 11). What this
                    // ADD took of the other family is kept for the retry.
                    alloc
                        .demand
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    return Response::error(
                        ErrorCode::NotReady,
                        format!("{who}: {e}; requested a block, try again later"),
                    );
                }
                Err(e) => return Response::error(ErrorCode::Failed, format!("{who}: {e}")),
            }
        }
        tracing::info!(owner = owner.as_str(), pod, pool = pool.as_str(), from = source.name(), ips = ?ips.iter().map(|i| i.address).collect::<Vec<_>>(), "pod addresses allocated");
        Response::Allocated { ips }
    }

    /// The addresses asked for: by the runtime (the CNI `ips` capability), else by the pod's
    /// annotations; why not, when the request cannot be served on this node.
    fn requested(
        &self,
        who: &str,
        pod: Option<&str>,
        asked: &[IpAddr],
    ) -> Result<Vec<IpAddr>, (ErrorCode, String)> {
        let requested = if asked.is_empty() {
            self.pools.annotated_addresses(who, pod)?
        } else {
            asked.to_vec()
        };
        fixed::check(who, &requested, &self.families)
            .map_err(|e| (ErrorCode::BadRequest, e.to_string()))?;
        Ok(requested)
    }

    /// Gives `owner` the `requested` addresses, and of each other family this node serves any
    /// address; all or nothing: a refusal releases what this request took.
    fn allocate_requested(
        &self,
        who: &str,
        owner: &str,
        pool: &str,
        alloc: &PoolAllocator,
        requested: &[IpAddr],
    ) -> Response {
        let mut ips = Vec::new();
        let mut taken_now = Vec::new();
        for family in &self.families {
            let held = alloc.alloc.with(|a| a.lookup(owner, *family)).is_some();
            let asked = requested.iter().find(|ip| Family::of(**ip) == *family);
            let result = match asked {
                Some(ip) => alloc.alloc.allocate_ip(owner, *ip).map(|()| *ip),
                None => alloc.alloc.allocate(owner, *family),
            };
            match result {
                Ok(ip) => {
                    if !held {
                        taken_now.push(*family);
                    }
                    ips.push(self.describe(alloc, ip));
                }
                Err(e) => {
                    for family in taken_now {
                        if let Err(e) = alloc.alloc.release(owner, family) {
                            tracing::warn!(owner, "releasing a refused request's address: {e}");
                        }
                    }
                    return self.refused(who, pool, alloc, asked.copied(), e);
                }
            }
        }
        tracing::info!(owner, pool, ips = ?ips.iter().map(|i| i.address).collect::<Vec<_>>(), "pod addresses allocated as requested");
        Response::Allocated { ips }
    }

    /// Why a request for `asked` (or, with none, any address) is refused, said to the user.
    fn refused(
        &self,
        who: &str,
        pool: &str,
        alloc: &PoolAllocator,
        asked: Option<IpAddr>,
        e: DurableError,
    ) -> Response {
        let DurableError::Alloc(e) = e else {
            return Response::error(ErrorCode::Failed, format!("{who}: {e}"));
        };
        match (&e, asked) {
            (AllocError::NoBlock { .. } | AllocError::Full { .. }, _) => {
                alloc
                    .demand
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                Response::error(
                    ErrorCode::NotReady,
                    format!("{who}: {e}; requested a block, try again later"),
                )
            }
            (AllocError::OutsideBlocks { blocks, .. }, Some(ip)) => {
                let blocks = blocks
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                let why = if self.pools.multi_pool() {
                    format!(
                        "{who}: asks for {ip}, which is not in this node's blocks of pool {pool} \
                         ({blocks}); ask for an address of those blocks, or name the pool that \
                         holds {ip} (annotation {}) and reserve it there",
                        ipam_core::pod::multipool::POOL_ANNOTATION
                    )
                } else {
                    format!(
                        "{who}: asks for {ip}, which is not in this node's block ({blocks}); in \
                         cluster-pool mode each node hands out its own block only, so a pod \
                         keeps a fixed address only on the node whose block holds it: pin the \
                         pod to that node (nodeSelector or affinity), or use multi-pool mode"
                    )
                };
                Response::error(ErrorCode::BadRequest, why)
            }
            (AllocError::Taken { holder, .. }, Some(ip)) => Response::error(
                ErrorCode::Failed,
                format!(
                    "{who}: asks for {ip}, which {holder} holds; delete what holds it (its DEL \
                     frees the address) or ask for another"
                ),
            ),
            _ => Response::error(ErrorCode::BadRequest, format!("{who}: {e}")),
        }
    }

    fn release(&self, id: &AttachmentId) -> Response {
        // Never leave the datapath pointing at an address that is free again.
        if let Err(e) = self.endpoints.remove(id) {
            return endpoint_error(e);
        }
        let owner = id.owner();
        let mut ips = Vec::new();
        for (_, alloc) in self.pools.all() {
            for family in [Family::V4, Family::V6] {
                match alloc.alloc.release(&owner, family) {
                    Ok(Some(ip)) => ips.push(ip),
                    Ok(None) => {}
                    Err(e) => return Response::error(ErrorCode::Failed, e.to_string()),
                }
            }
        }
        if !ips.is_empty() {
            tracing::info!(owner = owner.as_str(), ?ips, "pod addresses released");
        }
        Response::Released { ips }
    }

    fn held(&self, id: &AttachmentId) -> Vec<AllocatedIp> {
        let owner = id.owner();
        let mut held = Vec::new();
        for (_, alloc) in self.pools.all() {
            for family in [Family::V4, Family::V6] {
                if let Some(ip) = alloc.alloc.with(|a| a.lookup(&owner, family)) {
                    held.push(self.describe(&alloc, ip));
                }
            }
        }
        held
    }

    /// Hands the allocations and the endpoint an attachment had under its legacy key (made
    /// before attachments carried their network) to the network the request names. Container
    /// and interface are unique among live attachments, so the first network to name them is
    /// theirs. A GC adopts its valid attachments before it collects. Returns the answer for a
    /// request whose adoption failed (nothing else of it is done).
    fn adopt_legacy(&self, request: &Request) -> Option<Response> {
        let ids: Vec<&AttachmentId> = match request {
            Request::Allocate(a) | Request::Release(a) | Request::Check(a) => vec![&a.id],
            Request::RegisterEndpoint(e) => vec![&e.id],
            Request::RemoveEndpoint(id) => vec![id],
            Request::Gc { valid, .. } => valid.iter().collect(),
            Request::Status | Request::Endpoints | Request::Members => Vec::new(),
        };
        for id in ids.into_iter().filter(|id| !id.network.is_empty()) {
            let (legacy, owner) = (id.legacy_owner(), id.owner());
            for (pool, alloc) in self.pools.all() {
                for family in [Family::V4, Family::V6] {
                    if alloc.alloc.with(|a| a.lookup(&legacy, family)).is_none() {
                        continue;
                    }
                    match alloc.alloc.rename(&legacy, &owner, family) {
                        Ok(ip) => tracing::info!(
                            owner = owner.as_str(),
                            pool = pool.as_str(),
                            ?ip,
                            "allocation made before attachments named their network adopted \
                             by network {}",
                            id.network
                        ),
                        Err(e) => {
                            return Some(Response::error(
                                ErrorCode::Failed,
                                format!(
                                    "container {} interface {}: cannot hand its address to \
                                     network {}: {e}",
                                    id.container_id, id.ifname, id.network
                                ),
                            ));
                        }
                    }
                }
            }
            if let Err(e) = self.endpoints.adopt(id) {
                return Some(endpoint_error(e));
            }
        }
        None
    }

    /// CNI GC of one network: what that network holds for attachments not in `valid` is
    /// released. Another network's allocations are never looked at, nor allocations still
    /// under their legacy key unless the GC is itself from a plugin without networks.
    fn collect(&self, network: &str, valid: &[AttachmentId]) -> Response {
        let valid: std::collections::HashSet<&AttachmentId> = valid.iter().collect();
        if let Err(e) = self.endpoints.retain(network, &valid) {
            return endpoint_error(e);
        }
        let mut stale = std::collections::BTreeSet::new();
        for (_, alloc) in self.pools.all() {
            alloc.alloc.with(|a| {
                stale.extend(a.allocations().into_iter().filter_map(|(owner, _)| {
                    let id = AttachmentId::from_owner(&owner)?;
                    (id.network == network && !valid.contains(&id)).then_some(owner)
                }));
            });
        }
        let mut released = Vec::new();
        for owner in stale {
            let id = AttachmentId::from_owner(&owner).expect("filtered above");
            if let Response::Error { message, .. } = self.release(&id) {
                return Response::error(ErrorCode::Failed, message);
            }
            released.push(id);
        }
        if !released.is_empty() {
            tracing::info!(
                network,
                count = released.len(),
                "garbage collection released leaked pod addresses"
            );
        }
        Response::Collected { released }
    }
}
