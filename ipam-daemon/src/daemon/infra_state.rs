//! The node's infrastructure addresses (router, health, ingress) as the IPAM pass allocated
//! them, shared with the API, which hands the router address to pods as their gateway.

use std::{collections::BTreeMap, net::IpAddr};

use ipam_common::Family;

/// The node's router and health addresses, and what their allocation waits for.
#[derive(Debug, Clone, Default)]
pub(super) struct InfraState {
    pub(super) addresses: BTreeMap<String, BTreeMap<Family, IpAddr>>,
    pub(super) waiting: Option<String>,
}
