//! What happens to the cluster in one run: faults and object changes at set times, drawn from
//! the seed. Each event carries its own end (when a node comes back, when a partition heals),
//! so any subset of a run's events is a run too: that is what shrinking a failure relies on.

use std::{fmt, time::Duration};

use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::schedule::Stepping;

/// The size and length of the runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub nodes: usize,
    /// LoadBalancer Services; some share an IP, some are `externalTrafficPolicy: Local`.
    pub services: usize,
    /// Events per run.
    pub events: usize,
    /// When the last event may happen; the run goes on for [`crate::world::BOUND`] and more
    /// after the last fault has ended.
    pub span: Duration,
    /// How the run moves through time (the same run either way).
    pub stepping: Stepping,
}

impl Config {
    /// `nodes` nodes with the rest of the defaults.
    ///
    /// # Panics
    /// With fewer than 3 nodes: a majority of fewer means nothing.
    pub fn with_nodes(nodes: usize) -> Self {
        assert!(
            nodes >= 3,
            "a simulated cluster has 3 nodes or more, not {nodes}"
        );
        Self {
            nodes,
            services: (nodes * 2).clamp(6, 40),
            events: 12,
            span: Duration::from_secs(40),
            stepping: Stepping::default(),
        }
    }
}

/// One thing that happens, to one node or to the network or the objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The machine loses power: its agent and responders are gone with it. It boots again
    /// after `back_after` (never, with none).
    PowerLoss {
        node: usize,
        back_after: Option<Duration>,
    },
    /// The agent is killed (SIGKILL, OOM): the responders run on their last heartbeat. Its
    /// next agent starts after `back_after`.
    Kill { node: usize, back_after: Duration },
    /// The agent stops for a restart (`on_stop = "restart"`), promising to be back within
    /// `within`; its next agent starts after `back_after` (never, with none: it died in the
    /// middle of the restart).
    StopForRestart {
        node: usize,
        within: Duration,
        back_after: Option<Duration>,
    },
    /// The agent stops and leaves the cluster (`on_stop = "leave"`); its next agent starts
    /// after `back_after`.
    StopToLeave { node: usize, back_after: Duration },
    /// The node's NIC goes down for `lasting`: it neither sends nor receives, nor answers.
    NicDown { node: usize, lasting: Duration },
    /// The network splits: `side` on one side, the others on the other, for `lasting`.
    Partition { side: Vec<usize>, lasting: Duration },
    /// The node's packets to the others are lost for `lasting`; it still receives theirs.
    OneWay { node: usize, lasting: Duration },
    /// A firewall drops the gossip's packets to and from the node for `lasting` (a rule on
    /// UDP 7946 pushed in the wrong order, say): the others declare it dead while its kernel
    /// and its kubelet answer as always.
    GossipBlocked { node: usize, lasting: Duration },
    /// Every packet between nodes is lost with this chance (in thousandths) for `lasting`.
    Loss { per_mille: u32, lasting: Duration },
    /// The node's watch on the store fails for `lasting`: its copies freeze, then catch up.
    WatchStall { node: usize, lasting: Duration },
    /// A Local Service's ready endpoints move to these nodes.
    EndpointsMove { service: usize, to: Vec<usize> },
    /// Service number `service` is created (`store::service`), asking, with `requests`, for
    /// the IP the `requests`-th Service holds (another tenant's, say).
    ServiceCreated {
        service: usize,
        requests: Option<usize>,
    },
    /// The `service`-th Service (in name order) is deleted.
    ServiceDeleted { service: usize },
}

impl Event {
    /// Whether the event is a fault (endpoints moving are the cluster's life, not a fault).
    pub fn is_fault(&self) -> bool {
        !matches!(
            self,
            Self::EndpointsMove { .. } | Self::ServiceCreated { .. } | Self::ServiceDeleted { .. }
        )
    }

    /// A short name, for the counts of what a run exercised.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::PowerLoss {
                back_after: None, ..
            } => "power loss for good",
            Self::PowerLoss { .. } => "power loss",
            Self::Kill { .. } => "SIGKILL",
            Self::StopForRestart {
                back_after: None, ..
            } => "death during a restart",
            Self::StopForRestart { .. } => "stop for a restart",
            Self::StopToLeave { .. } => "stop to leave",
            Self::NicDown { .. } => "NIC down",
            Self::Partition { .. } => "partition",
            Self::OneWay { .. } => "one-way partition",
            Self::GossipBlocked { .. } => "gossip port blocked",
            Self::Loss { .. } => "packet loss",
            Self::WatchStall { .. } => "failing watch",
            Self::EndpointsMove { .. } => "endpoints move",
            Self::ServiceCreated { requests: None, .. } => "Service created",
            Self::ServiceCreated { .. } => "Service created asking for a held IP",
            Self::ServiceDeleted { .. } => "Service deleted",
        }
    }

    /// How long after it happens the event's effects last at most (its own end).
    pub fn lasting(&self) -> Duration {
        match self {
            Self::PowerLoss { back_after, .. } => back_after.unwrap_or_default(),
            Self::Kill { back_after, .. } | Self::StopToLeave { back_after, .. } => *back_after,
            Self::StopForRestart {
                within, back_after, ..
            } => back_after.map_or(*within, |b| b.max(*within)),
            Self::NicDown { lasting, .. }
            | Self::Partition { lasting, .. }
            | Self::OneWay { lasting, .. }
            | Self::GossipBlocked { lasting, .. }
            | Self::Loss { lasting, .. }
            | Self::WatchStall { lasting, .. } => *lasting,
            Self::EndpointsMove { .. }
            | Self::ServiceCreated { .. }
            | Self::ServiceDeleted { .. } => Duration::ZERO,
        }
    }
}

/// An event and when it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timed {
    pub at: Duration,
    pub event: Event,
}

impl fmt::Display for Timed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={:>7.3}s {:?}", self.at.as_secs_f64(), self.event)
    }
}

/// The events of `seed`'s run, in time order.
pub fn events(config: &Config, seed: u64) -> Vec<Timed> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5ce7_a710);
    let mut out: Vec<Timed> = (0..config.events)
        .map(|_| {
            // The first seconds are the cluster settling after the start.
            let at =
                Duration::from_millis(rng.random_range(3_000..=config.span.as_millis() as u64));
            Timed {
                at,
                event: random_event(&mut rng, config),
            }
        })
        .collect();
    out.sort_by_key(|t| t.at);
    out
}

fn ms(rng: &mut StdRng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.random_range(range))
}

fn random_event(rng: &mut StdRng, config: &Config) -> Event {
    let node = rng.random_range(0..config.nodes);
    match rng.random_range(0..104) {
        0..10 => Event::PowerLoss {
            node,
            back_after: (!rng.random_bool(0.2)).then(|| ms(rng, 1_000..=15_000)),
        },
        10..22 => Event::Kill {
            node,
            back_after: ms(rng, 200..=5_000),
        },
        22..40 => Event::StopForRestart {
            node,
            within: ms(rng, 2_000..=15_000),
            back_after: (!rng.random_bool(0.2)).then(|| ms(rng, 300..=12_000)),
        },
        40..48 => Event::StopToLeave {
            node,
            back_after: ms(rng, 500..=5_000),
        },
        48..56 => Event::NicDown {
            node,
            lasting: ms(rng, 100..=4_000),
        },
        56..64 => {
            let minority = rng.random_range(1..=config.nodes.saturating_sub(1).max(1) / 2 + 1);
            let mut side: Vec<usize> = (0..config.nodes).collect();
            for i in (1..side.len()).rev() {
                side.swap(i, rng.random_range(0..=i));
            }
            side.truncate(minority.min(config.nodes - 1).max(1));
            side.sort_unstable();
            Event::Partition {
                side,
                lasting: ms(rng, 200..=6_000),
            }
        }
        64..70 => Event::OneWay {
            node,
            lasting: ms(rng, 200..=3_000),
        },
        70..76 => Event::Loss {
            per_mille: rng.random_range(10..=300),
            lasting: ms(rng, 500..=5_000),
        },
        76..86 => Event::WatchStall {
            node,
            lasting: ms(rng, 500..=20_000),
        },
        86..91 => Event::ServiceCreated {
            service: config.services + rng.random_range(0..config.services),
            requests: rng
                .random_bool(0.5)
                .then(|| rng.random_range(0..config.services)),
        },
        91..94 => Event::ServiceDeleted {
            service: rng.random_range(0..config.services),
        },
        100.. => Event::GossipBlocked {
            node,
            lasting: ms(rng, 1_000..=20_000),
        },
        _ => {
            let count = rng.random_range(0..=2.min(config.nodes));
            let to = (0..count)
                .map(|_| rng.random_range(0..config.nodes))
                .collect();
            Event::EndpointsMove {
                service: rng.random_range(0..config.services),
                to,
            }
        }
    }
}
