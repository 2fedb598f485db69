//! Types of the L2 announcement responder: which IPs are answered where, and its liveness gate.

/// Maximum number of (IP, interface) announcements one node can hold.
pub const L2_RESPONDER_CAPACITY: usize = 16_384;

/// Key of the responder map: an IP announced on one interface.
///
/// IPv4 addresses are stored IPv4-mapped (`::ffff:a.b.c.d`), so one map serves both families
/// without a family field and a v4 key can never collide with a real v6 address.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResponderKey {
    /// The address in network byte order (16 bytes, IPv4-mapped for IPv4).
    pub addr: [u8; 16],
    /// The interface the announcement is made on.
    pub ifindex: u32,
}
const _: () = assert!(core::mem::size_of::<ResponderKey>() == 20);

impl ResponderKey {
    /// Key for an IPv4 address given as its four octets.
    pub const fn v4(octets: [u8; 4], ifindex: u32) -> Self {
        Self {
            addr: crate::ipv4_mapped(octets),
            ifindex,
        }
    }

    /// Key for an IPv6 address given as its sixteen octets.
    pub const fn v6(octets: [u8; 16], ifindex: u32) -> Self {
        Self {
            addr: octets,
            ifindex,
        }
    }
}

/// Value of the responder map, one copy per CPU (the map is per-CPU so that counting replies needs
/// no atomics). The daemon always writes the whole value on every CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L2Announcement {
    /// The MAC address answered with (normally the announcing interface's own MAC).
    pub mac: [u8; 6],
    /// Explicit padding; always zero.
    pub _pad: [u8; 2],
    /// Replies sent for this entry on this CPU since the entry was written.
    pub replies: u64,
}
const _: () = assert!(core::mem::size_of::<L2Announcement>() == 16);

impl L2Announcement {
    /// A fresh entry answering with `mac`, counters at zero.
    pub const fn new(mac: [u8; 6]) -> Self {
        Self {
            mac,
            _pad: [0; 2],
            replies: 0,
        }
    }
}

/// Maximum number of Service IPs (on one interface each) being handed over at once.
pub const L2_HANDOVER_CAPACITY: usize = 4_096;
/// Maximum number of TCP connections opened with this node during hand-overs that are
/// remembered as its own (least recently used forgotten first).
pub const L2_HANDOVER_FLOWS_CAPACITY: usize = 65_536;

/// Value of the hand-over map, keyed by [`ResponderKey`]: an IP this node took from a node that
/// still runs and keeps the IP on its `lo` for a while (the daemon's `l2::owners::LINGER`).
/// Until `until_ns`, TCP segments to the IP on that interface of connections not opened with
/// this node (no SYN seen here since the hand-over) go on to the old owner, at `mac`: the
/// connections a client opened before it followed the new owner's gratuitous ARP live on
/// there, instead of being reset here.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L2Handover {
    /// The old owner's MAC on the segment.
    pub mac: [u8; 6],
    /// Explicit padding; always zero.
    pub _pad: [u8; 2],
    /// Until when (CLOCK_MONOTONIC nanoseconds, `bpf_ktime_get_ns`) segments go on.
    pub until_ns: u64,
}
const _: () = assert!(core::mem::size_of::<L2Handover>() == 16);

/// Liveness gate of the responder, at index 0 of its config map.
///
/// The responder answers only while `jiffies <= deadline_jiffies`, so a hung daemon stops
/// answering instead of holding an address it can no longer manage; `deadline_jiffies == 0`
/// means "never alive". The gate reads jiffies because the verifier inlines `bpf_jiffies64`
/// (a load), where a clock helper call cost about 38 ns per reply (`cargo xtask bench arp`).
///
/// The daemon writes `max_staleness_ns` and its length in ticks, `staleness_jiffies` (rounded
/// down: the deadline never falls later than the timeout), and proves it is alive by running
/// the `l2_heartbeat` program, which sets `deadline_jiffies = jiffies + staleness_jiffies` and
/// `heartbeat_ns` (CLOCK_MONOTONIC, for `ipamctl status`) from the kernel's own clocks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ResponderConfig {
    /// Last time the daemon proved it was alive, in CLOCK_MONOTONIC nanoseconds.
    pub heartbeat_ns: u64,
    /// How old the heartbeat may be before the responder goes silent.
    pub max_staleness_ns: u64,
    /// The last jiffy at which the responder still answers.
    pub deadline_jiffies: u64,
    /// `max_staleness_ns` in whole ticks.
    pub staleness_jiffies: u64,
}
const _: () = assert!(core::mem::size_of::<ResponderConfig>() == 32);

/// Indexes of the responder's per-CPU counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponderStat {
    /// ARP requests answered.
    ArpReplies = 0,
    /// Neighbour solicitations answered with a neighbour advertisement.
    NdpReplies = 1,
    /// Requests for an announced IP left unanswered because the daemon's heartbeat was stale.
    StaleSkipped = 2,
    /// ARP or NDP frames for us that were malformed and passed to the kernel untouched.
    Malformed = 3,
}

impl ResponderStat {
    /// Number of counters (size of the stats map).
    pub const COUNT: usize = 4;
    /// All counters, in index order.
    pub const ALL: [ResponderStat; Self::COUNT] = [
        Self::ArpReplies,
        Self::NdpReplies,
        Self::StaleSkipped,
        Self::Malformed,
    ];

    /// A short name for CLIs and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Self::ArpReplies => "arp_replies",
            Self::NdpReplies => "ndp_replies",
            Self::StaleSkipped => "stale_skipped",
            Self::Malformed => "malformed",
        }
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data, `#[repr(C)]`, every bit pattern valid, no implicit padding
    // (sizes asserted above).
    unsafe impl aya::Pod for super::ResponderKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::L2Announcement {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ResponderConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::L2Handover {}
}
