//! `ipamctl migrate`: Cilium's and MetalLB's resources (CiliumLoadBalancerIPPool,
//! CiliumL2AnnouncementPolicy, CiliumPodIPPool, CiliumBGPClusterConfig with the
//! CiliumBGPPeerConfigs and CiliumBGPAdvertisements it leads to, CiliumBGPPeeringPolicy;
//! IPAddressPool, L2Advertisement, BGPPeer, BGPAdvertisement with the BFDProfiles and
//! Communities they name) converted into this project's, printed as YAML ready for
//! `kubectl apply` or `ipamctl apply`.
//!
//! Every field of the input is either carried over or reported as dropped, with why; the exit
//! code says whether anything was. `--check` then asks the store whether the converted pools
//! would give every Service the IPs it holds now (`check`).

mod check;
mod cilium;
mod cilium_bgp;
mod fields;
mod metallb;
mod metallb_bgp;

use std::{collections::BTreeMap, path::Path};

use ipam_core::{
    lb::{
        bgp::{BgpAdvertisement, BgpAdvertisementSpec, BgpPeer, BgpPeerSpec},
        resources::{L2AnnouncementPolicy, L2PolicySpec, LbIpPool, LbIpPoolSpec, Selector},
    },
    pod::pool::PodIpPoolSpec,
    resources::PodIpPool,
    store::Resource as _,
};
use serde::Serialize;
use serde_yaml_ng::Value;

pub(crate) use check::check;
use fields::{Bad, Fields};

/// The exit code when the conversion dropped a field (the output is still printed).
pub(crate) const EXIT_DROPPED: i32 = 2;
/// The exit code of `--check` when a Service would not keep its IPs.
pub(crate) const EXIT_RENUMBERED: i32 = 3;

/// One of this project's objects, converted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Target {
    LbPool(LbIpPoolSpec),
    L2Policy(L2PolicySpec),
    PodPool(PodIpPoolSpec),
    BgpPeer(Box<BgpPeerSpec>),
    BgpAdvertisement(BgpAdvertisementSpec),
}

impl Target {
    pub(crate) fn kind(&self) -> &'static str {
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
pub(crate) struct Converted {
    pub name: String,
    pub target: Target,
    /// The input object it came from (`cilium.yaml: document 1 (CiliumLoadBalancerIPPool blue)`).
    pub from: String,
    /// Its labels: a pool's, which advertisements and policies select (`ipPoolSelector`).
    pub labels: BTreeMap<String, String>,
}

/// A field (or a whole object) of the input that has no counterpart here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dropped {
    pub from: String,
    pub field: String,
    pub why: String,
}

/// What the conversion produced: the objects, what it dropped, and notes on what it carried
/// over in another form (an interface name made a pattern, a list of selectors made several
/// policies).
#[derive(Debug, Default)]
pub(crate) struct Migration {
    pub converted: Vec<Converted>,
    pub dropped: Vec<Dropped>,
    pub notes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum MigrateError {
    #[error("{file}: document {document} is not valid YAML: {source}")]
    Yaml {
        file: String,
        document: usize,
        source: serde_yaml_ng::Error,
    },
    #[error("{from}: {field}: {why}. Nothing was converted")]
    Field {
        from: String,
        field: String,
        why: String,
    },
    #[error(
        "{first} and {second} would both become the {kind} {name}; rename one of them (or \
         convert them separately) before migrating"
    )]
    Clash {
        kind: &'static str,
        name: String,
        first: String,
        second: String,
    },
}

/// One object of the input, as read: where it is, what it is.
#[derive(Debug)]
pub(crate) struct Source {
    /// `file: document N` (and `item I` inside a `List`), 1-based as editors count.
    at: String,
    group: String,
    kind: String,
    name: String,
    labels: BTreeMap<String, String>,
    spec: Value,
}

impl Source {
    /// `file: document N (Kind name)`, how errors and reports name it.
    pub(crate) fn describe(&self) -> String {
        format!("{} ({} {})", self.at, self.kind, self.name)
    }

    fn spec(&self) -> Result<Fields, MigrateError> {
        Fields::of("spec", self.spec.clone()).map_err(|bad| self.error(bad))
    }

    fn error(&self, bad: Bad) -> MigrateError {
        MigrateError::Field {
            from: self.describe(),
            field: bad.field,
            why: bad.why,
        }
    }
}

/// The pools of the input with their labels, which advertisements select by name or by label:
/// MetalLB's IPAddressPools, or Cilium's CiliumLoadBalancerIPPools.
#[derive(Debug, Default)]
pub(super) struct Pools {
    labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl Pools {
    /// The objects of `kind` in `group` (or with no group).
    pub(super) fn of(sources: &[Source], group: &str, kind: &str) -> Self {
        let labels = sources
            .iter()
            .filter(|s| s.kind == kind && (s.group == group || s.group.is_empty()))
            .map(|s| (s.name.clone(), s.labels.clone()))
            .collect();
        Self { labels }
    }

    pub(super) fn selected_by(&self, selector: &Selector) -> impl Iterator<Item = &String> {
        self.labels
            .iter()
            .filter(move |(_, labels)| selector.matches(labels))
            .map(|(name, _)| name)
    }
}

/// Collects what one object's conversion dropped and noted.
pub(crate) struct Report<'a> {
    from: String,
    migration: &'a mut Migration,
}

impl Report<'_> {
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

/// Reads every document of `text` (from `file`), expanding `List`s as `kubectl get -o yaml`
/// writes them.
pub(crate) fn read(file: &str, text: &str) -> Result<Vec<Source>, MigrateError> {
    use serde::Deserialize as _;
    let mut sources = Vec::new();
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let document = index + 1;
        let value = Value::deserialize(doc).map_err(|source| MigrateError::Yaml {
            file: file.to_owned(),
            document,
            source,
        })?;
        if value.is_null() {
            continue;
        }
        let at = format!("{file}: document {document}");
        let is_list = value
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k == "List" || k.ends_with("List"));
        if is_list {
            let items = Fields::of("", value)
                .and_then(|mut list| list.list("items"))
                .map_err(|bad| MigrateError::Field {
                    from: at.clone(),
                    field: bad.field,
                    why: bad.why,
                })?;
            for (i, (_, item)) in items.into_iter().enumerate() {
                sources.push(source(format!("{at} item {}", i + 1), item)?);
            }
        } else {
            sources.push(source(at, value)?);
        }
    }
    Ok(sources)
}

/// One object: its kind, group, name and labels read, its spec kept for the converter.
fn source(at: String, value: Value) -> Result<Source, MigrateError> {
    let fail = |bad: Bad| MigrateError::Field {
        from: at.clone(),
        field: bad.field,
        why: bad.why,
    };
    let mut top = Fields::of("", value).map_err(fail)?;
    let kind = top
        .string("kind")
        .map_err(fail)?
        .ok_or_else(|| fail(Bad::new("kind", "missing: every object names its kind")))?;
    let api_version = top.string("apiVersion").map_err(fail)?.unwrap_or_default();
    let group = api_version
        .rsplit_once('/')
        .map_or("", |(group, _)| group)
        .to_owned();
    let mut metadata = top
        .fields("metadata")
        .map_err(fail)?
        .ok_or_else(|| fail(Bad::new("metadata", "missing: every object has a name")))?;
    let name = metadata.string("name").map_err(fail)?.ok_or_else(|| {
        fail(Bad::new(
            "metadata.name",
            "missing: every object has a name",
        ))
    })?;
    let mut labels = BTreeMap::new();
    if let Some(mut l) = metadata.fields("labels").map_err(fail)? {
        for key in l.keys() {
            if let Some(v) = l.string(&key).map_err(fail)? {
                labels.insert(key, v);
            }
        }
    }
    let spec = top.take("spec").map(|(_, v)| v).unwrap_or(Value::Null);
    Ok(Source {
        at,
        group,
        kind,
        name,
        labels,
        spec,
    })
}

/// The kinds read, for messages.
const READ_KINDS: &str = "CiliumLoadBalancerIPPool, CiliumL2AnnouncementPolicy, CiliumPodIPPool, \
                          CiliumBGPClusterConfig, CiliumBGPPeerConfig, CiliumBGPAdvertisement, \
                          CiliumBGPPeeringPolicy (cilium.io) and IPAddressPool, \
                          L2Advertisement, BGPPeer, BGPAdvertisement, BFDProfile, Community \
                          (metallb.io)";

/// Converts every object of `sources`. An object of the wrong shape stops it all (nothing half
/// converted is printed); fields and objects without a counterpart are reported in the result.
pub(crate) fn convert(sources: &[Source]) -> Result<Migration, MigrateError> {
    let mut migration = Migration::default();
    let pools = Pools::of(sources, "metallb.io", "IPAddressPool");
    let named = metallb_bgp::Named::of(sources);
    let cilium_index = cilium_bgp::Index::of(sources);
    for source in sources {
        let mut report = Report {
            from: source.describe(),
            migration: &mut migration,
        };
        let group = source.group.as_str();
        let converted: Vec<(String, Target)> = match (group, source.kind.as_str()) {
            ("cilium.io" | "", "CiliumLoadBalancerIPPool") => {
                let spec =
                    cilium::lb_pool(source.spec()?, &mut report).map_err(|b| source.error(b))?;
                vec![(source.name.clone(), Target::LbPool(spec))]
            }
            ("cilium.io" | "", "CiliumL2AnnouncementPolicy") => {
                let spec =
                    cilium::l2_policy(source.spec()?, &mut report).map_err(|b| source.error(b))?;
                vec![(source.name.clone(), Target::L2Policy(spec))]
            }
            ("cilium.io" | "", "CiliumPodIPPool") => {
                let spec =
                    cilium::pod_pool(source.spec()?, &mut report).map_err(|b| source.error(b))?;
                vec![(source.name.clone(), Target::PodPool(spec))]
            }
            ("metallb.io" | "", "IPAddressPool") => {
                let spec = metallb::address_pool(source.spec()?, &mut report)
                    .map_err(|b| source.error(b))?;
                vec![(source.name.clone(), Target::LbPool(spec))]
            }
            ("metallb.io" | "", "L2Advertisement") => {
                metallb::l2_advertisement(&source.name, source.spec()?, &pools, &mut report)
                    .map_err(|b| source.error(b))?
                    .into_iter()
                    .map(|(name, spec)| (name, Target::L2Policy(spec)))
                    .collect()
            }
            ("metallb.io" | "", "BGPPeer") => {
                let spec = metallb_bgp::peer(source.spec()?, &named, &mut report)
                    .map_err(|b| source.error(b))?;
                vec![(source.name.clone(), Target::BgpPeer(Box::new(spec)))]
            }
            ("metallb.io" | "", "BGPAdvertisement") => {
                let spec = metallb_bgp::advertisement(source.spec()?, &pools, &named, &mut report)
                    .map_err(|b| source.error(b))?;
                vec![(source.name.clone(), Target::BgpAdvertisement(spec))]
            }
            // Read where a BGPPeer or BGPAdvertisement names them; nothing of their own.
            ("metallb.io" | "", "BFDProfile" | "Community") => Vec::new(),
            ("cilium.io" | "", "CiliumBGPClusterConfig") => {
                cilium_bgp::cluster_config(source.spec()?, &cilium_index, &mut report)
                    .map_err(|b| source.error(b))?
                    .into_iter()
                    .map(|(name, spec)| (name, Target::BgpPeer(Box::new(spec))))
                    .collect()
            }
            // Its settings go into the peers that name it; read for what it drops.
            ("cilium.io" | "", "CiliumBGPPeerConfig") => {
                cilium_bgp::peer_config_object(source.spec()?, &mut report)
                    .map_err(|b| source.error(b))?;
                Vec::new()
            }
            ("cilium.io" | "", "CiliumBGPAdvertisement") => cilium_bgp::advertisement(
                &source.name,
                &source.labels,
                source.spec()?,
                &cilium_index,
                &mut report,
            )
            .map_err(|b| source.error(b))?
            .into_iter()
            .map(|(name, spec)| (name, Target::BgpAdvertisement(spec)))
            .collect(),
            ("cilium.io" | "", "CiliumBGPPeeringPolicy") => {
                cilium_bgp::peering_policy(&source.name, source.spec()?, &cilium_index, &mut report)
                    .map_err(|b| source.error(b))?
            }
            ("cilium.io" | "", "CiliumBGPNodeConfigOverride") => {
                report.dropped(
                    "(the whole object)",
                    "per-node settings: a node's router ID is [bgp] router_id in its agent's \
                     configuration; its local address and port are BIRD's choice",
                );
                Vec::new()
            }
            ("cilium.io" | "", "CiliumBGPNodeConfig") => {
                report.dropped(
                    "(the whole object)",
                    "Cilium's operator writes it from the CiliumBGPClusterConfigs: convert those",
                );
                Vec::new()
            }
            (_, kind) => {
                report.dropped(
                    "(the whole object)",
                    format!("{kind} is not a kind ipamctl migrate converts; it reads {READ_KINDS}"),
                );
                Vec::new()
            }
        };
        for (name, target) in converted {
            let from = source.describe();
            if let Some(first) = migration
                .converted
                .iter()
                .find(|c| c.name == name && c.target.kind() == target.kind())
            {
                return Err(MigrateError::Clash {
                    kind: target.kind(),
                    name,
                    first: first.from.clone(),
                    second: from,
                });
            }
            let labels = match target {
                Target::LbPool(_) => source.labels.clone(),
                _ => BTreeMap::new(),
            };
            migration.converted.push(Converted {
                name,
                target,
                from,
                labels,
            });
        }
    }
    Ok(migration)
}

/// A converted object as a manifest.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Manifest<'a> {
    api_version: String,
    kind: &'static str,
    metadata: ManifestMetadata<'a>,
    spec: serde_yaml_ng::Value,
}

#[derive(Serialize)]
struct ManifestMetadata<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: &'a BTreeMap<String, String>,
}

/// The converted objects as YAML documents, each headed by a comment naming its source.
pub(crate) fn render(migration: &Migration) -> Result<String, serde_yaml_ng::Error> {
    use ipam_kube::crd::{GROUP, VERSION};
    let mut out = String::new();
    for c in &migration.converted {
        let spec = match &c.target {
            Target::LbPool(spec) => serde_yaml_ng::to_value(spec),
            Target::L2Policy(spec) => serde_yaml_ng::to_value(spec),
            Target::PodPool(spec) => serde_yaml_ng::to_value(spec),
            Target::BgpPeer(spec) => serde_yaml_ng::to_value(spec),
            Target::BgpAdvertisement(spec) => serde_yaml_ng::to_value(spec),
        }?;
        let yaml = serde_yaml_ng::to_string(&Manifest {
            api_version: format!("{GROUP}/{VERSION}"),
            kind: c.target.kind(),
            metadata: ManifestMetadata {
                name: &c.name,
                labels: &c.labels,
            },
            spec,
        })?;
        out.push_str(&format!("---\n# from {}\n{yaml}", c.from));
    }
    Ok(out)
}

/// `ipamctl migrate -f FILE`: prints the converted objects on stdout and what was dropped on
/// stderr; returns the exit code.
pub(crate) fn run(file: &Path) -> anyhow::Result<i32> {
    let migration = load(file)?;
    print!("{}", render(&migration)?);
    Ok(report(&migration))
}

/// Reads and converts `file` (`-`: standard input).
pub(crate) fn load(file: &Path) -> anyhow::Result<Migration> {
    let (name, text) = crate::objects::read_input(file)?;
    Ok(convert(&read(&name, &text)?)?)
}

/// Prints the notes and what was dropped on stderr; the exit code.
pub(crate) fn report(migration: &Migration) -> i32 {
    for note in &migration.notes {
        eprintln!("note: {note}");
    }
    for d in &migration.dropped {
        eprintln!("dropped: {}: {}: {}", d.from, d.field, d.why);
    }
    if migration.dropped.is_empty() {
        0
    } else {
        eprintln!(
            "{} field(s) or object(s) were not carried over (listed above); the output holds \
             everything else",
            migration.dropped.len()
        );
        EXIT_DROPPED
    }
}

#[cfg(test)]
mod tests;
