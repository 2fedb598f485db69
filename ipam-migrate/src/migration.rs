//! What a conversion produces: this project's objects, what had no counterpart, notes; and the
//! `Report` each converter fills for the object it reads.

use std::collections::BTreeMap;

use ipam_core::{
    lb::{
        bgp::{BgpAdvertisement, BgpAdvertisementSpec, BgpPeer, BgpPeerSpec},
        resources::{L2AnnouncementPolicy, L2PolicySpec, LbIpPool, LbIpPoolSpec},
    },
    pod::pool::PodIpPoolSpec,
    resources::PodIpPool,
    store::Resource as _,
};

use crate::fields::Fields;

/// One of this project's objects, converted.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    LbPool(LbIpPoolSpec),
    L2Policy(L2PolicySpec),
    PodPool(PodIpPoolSpec),
    BgpPeer(Box<BgpPeerSpec>),
    BgpAdvertisement(BgpAdvertisementSpec),
}

impl Target {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::LbPool(_) => LbIpPool::KIND,
            Self::L2Policy(_) => L2AnnouncementPolicy::KIND,
            Self::PodPool(_) => PodIpPool::KIND,
            Self::BgpPeer(_) => BgpPeer::KIND,
            Self::BgpAdvertisement(_) => BgpAdvertisement::KIND,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Converted {
    pub name: String,
    pub target: Target,
    /// The input object it came from (`cilium.yaml: document 1 (CiliumLoadBalancerIPPool blue)`).
    pub from: String,
    /// Its labels: a pool's, which advertisements and policies select (`ipPoolSelector`).
    pub labels: BTreeMap<String, String>,
}

/// A field (or a whole object) of the input that has no counterpart here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub from: String,
    pub field: String,
    pub why: String,
}

/// What the conversion produced: the objects, what it dropped, and notes on what it carried
/// over in another form (an interface name made a pattern, a list of selectors made several
/// policies).
#[derive(Debug, Default)]
pub struct Migration {
    pub converted: Vec<Converted>,
    pub dropped: Vec<Dropped>,
    pub notes: Vec<String>,
}

/// Collects what one object's conversion dropped and noted.
pub(crate) struct Report<'a> {
    from: String,
    migration: &'a mut Migration,
}

impl<'a> Report<'a> {
    /// A report on the object `from` (as `Source::describe` names it), into `migration`.
    pub(crate) fn new(from: String, migration: &'a mut Migration) -> Self {
        Self { from, migration }
    }

    pub(crate) fn dropped(&mut self, field: impl Into<String>, why: impl Into<String>) {
        self.migration.dropped.push(Dropped {
            from: self.from.clone(),
            field: field.into(),
            why: why.into(),
        });
    }

    /// Every field `fields` did not read: no counterpart here.
    pub(crate) fn rest(&mut self, fields: Fields) {
        for field in fields.rest() {
            self.dropped(
                field,
                "no counterpart in this project (docs/migration.md lists what is carried over)",
            );
        }
    }

    pub(crate) fn note(&mut self, note: impl std::fmt::Display) {
        let note = format!("{}: {note}", self.from);
        self.migration.notes.push(note);
    }
}
