//! What BIRD says of its sessions (`birdc show protocols all`), and why one is not up, in the
//! words a user acts on.

use std::collections::BTreeMap;

/// One BGP session as BIRD reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Session {
    /// BIRD's protocol name (`bird_config::protocol_name`).
    pub protocol: String,
    /// The BGP state: Idle, Connect, Active, OpenSent, OpenConfirm, Established.
    pub state: String,
    pub routes_exported: u32,
    /// BIRD's last error, as it words it.
    pub last_error: String,
}

impl Session {
    pub fn is_established(&self) -> bool {
        self.state == "Established"
    }
}

/// The BGP sessions in `birdc show protocols all` output, by protocol name.
pub fn parse(text: &str) -> BTreeMap<String, Session> {
    let mut out = BTreeMap::new();
    let mut current: Option<Session> = None;
    for line in text.lines() {
        let indented = line.starts_with(' ') || line.starts_with('\t');
        if !indented {
            if let Some(done) = current.take() {
                out.insert(done.protocol.clone(), done);
            }
            let mut words = line.split_whitespace();
            if let (Some(name), Some("BGP")) = (words.next(), words.next()) {
                current = Some(Session {
                    protocol: name.to_owned(),
                    ..Session::default()
                });
            }
            continue;
        }
        let Some(session) = current.as_mut() else {
            continue;
        };
        let line = line.trim();
        if let Some(state) = line.strip_prefix("BGP state:") {
            session.state = state.trim().to_owned();
        } else if let Some(error) = line.strip_prefix("Last error:") {
            session.last_error = error.trim().to_owned();
        } else if let Some(routes) = line.strip_prefix("Routes:") {
            // "0 imported, 3 exported, 0 preferred"
            session.routes_exported += routes
                .split(',')
                .find_map(|part| part.trim().strip_suffix(" exported"))
                .and_then(|n| n.trim().parse::<u32>().ok())
                .unwrap_or(0);
        }
    }
    if let Some(done) = current {
        out.insert(done.protocol.clone(), done);
    }
    out
}

/// Why a session is not established, as users read it (the metric's label, the start of the
/// status's reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownReason {
    AsnMismatch,
    AuthenticationFailed,
    ConnectionRefused,
    NotDirectlyConnected,
    Unreachable,
    NoAnswer,
    SessionLost,
    /// The password's Secret cannot be read (no session is opened without it).
    PasswordUnavailable,
}

impl DownReason {
    pub const ALL: [Self; 8] = [
        Self::AsnMismatch,
        Self::AuthenticationFailed,
        Self::ConnectionRefused,
        Self::NotDirectlyConnected,
        Self::Unreachable,
        Self::NoAnswer,
        Self::SessionLost,
        Self::PasswordUnavailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::AsnMismatch => "ASNMismatch",
            Self::AuthenticationFailed => "AuthenticationFailed",
            Self::ConnectionRefused => "ConnectionRefused",
            Self::NotDirectlyConnected => "NotDirectlyConnected",
            Self::Unreachable => "Unreachable",
            Self::NoAnswer => "NoAnswer",
            Self::SessionLost => "SessionLost",
            Self::PasswordUnavailable => "PasswordUnavailable",
        }
    }
}

/// Why a session that is not established is down, as a condition's reason and message.
/// `auth_failures` says whether the kernel dropped TCP segments for a bad or missing MD5
/// signature since the last look (the only trace a password mismatch leaves: the segments
/// never reach BIRD).
pub fn why_down(
    session: &Session,
    has_password: bool,
    auth_failures: bool,
) -> (DownReason, String) {
    let error = session.last_error.as_str();
    let said = if error.is_empty() {
        String::new()
    } else {
        format!(" (BIRD: {error})")
    };
    let (reason, message) = match ERRORS.iter().find(|(pattern, ..)| error.contains(pattern)) {
        // BIRD names the AS mismatch itself, whatever the kernel saw.
        Some((_, reason @ DownReason::AsnMismatch, message)) => (*reason, *message),
        _ if auth_failures && has_password => (
            DownReason::AuthenticationFailed,
            "the kernel dropped the router's TCP segments for a wrong or missing MD5 \
             signature: the password differs from the router's",
        ),
        _ if auth_failures => (
            DownReason::AuthenticationFailed,
            "the router signs its TCP segments (TCP MD5) and this peer has no password: set \
             the router's password in the BGPPeer",
        ),
        Some((_, reason, message)) => (*reason, *message),
        None if has_password => (
            DownReason::NoAnswer,
            "the router does not answer; with a password set, a router without this password \
             (TCP MD5 drops such segments silently) is the likeliest cause, else the router is \
             down or filtered",
        ),
        None => (
            DownReason::NoAnswer,
            "the router does not answer: it is down, filtered, or not configured for this node",
        ),
    };
    (reason, format!("{message}{said}"))
}

/// What BIRD's last error says, in the order it is looked for: a pattern of the error, the
/// reason, and what to do.
const ERRORS: &[(&str, DownReason, &str)] = &[
    (
        "Bad peer AS",
        DownReason::AsnMismatch,
        "the router and this node disagree on an AS number: check peerASN against the \
         router's own AS and localASN against what the router expects of this node",
    ),
    (
        "Invalid next hop",
        DownReason::NotDirectlyConnected,
        "the router's address is on none of this node's networks: set ebgpMultihop for a \
         router more than one hop away, or use its address on the nodes' segment",
    ),
    (
        "Connection refused",
        DownReason::ConnectionRefused,
        "the router refuses the connection: it does not listen for BGP on that address and \
         port, or has no neighbour configured for this node's address",
    ),
    (
        "unreachable",
        DownReason::Unreachable,
        "no route to the router's address from this node",
    ),
    (
        "No route",
        DownReason::Unreachable,
        "no route to the router's address from this node",
    ),
    (
        "Hold timer expired",
        DownReason::SessionLost,
        "the session was up and the router stopped answering; it is being reopened",
    ),
    (
        "BFD session down",
        DownReason::SessionLost,
        "the session was up and the router stopped answering; it is being reopened",
    ),
];

/// The kernel's count of TCP segments dropped for MD5 signatures (`TcpExt` in
/// /proc/net/netstat: not found, unexpected, failed), in this network namespace.
pub fn md5_drops() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/net/netstat") else {
        return 0;
    };
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        return names
            .split_whitespace()
            .zip(values.split_whitespace())
            .filter(|(name, _)| {
                matches!(
                    *name,
                    "TCPMD5NotFound" | "TCPMD5Unexpected" | "TCPMD5Failure"
                )
            })
            .filter_map(|(_, v)| v.parse::<u64>().ok())
            .sum();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As BIRD 2.0 prints it (trimmed).
    const SHOW: &str = "\
BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
device1    Device     ---        up     17:45:23.116
services4  Static     master4    up     17:45:23.116
  Channel ipv4
    Routes:         2 imported, 0 exported, 2 preferred
peer_tor_1 BGP        ---        up     17:45:31.148  Established
  Description:    BGPPeer tor
  BGP state:          Established
    Neighbor address: 10.99.0.1
  Channel ipv4
    State:          UP
    Routes:         0 imported, 2 exported, 0 preferred
peer_bad_2 BGP        ---        start  17:45:23.282  Active        Socket: Connection refused
  BGP state:          Active
    Neighbor address: 10.99.0.9
    Last error:       Socket: Connection refused
  Channel ipv4
    State:          DOWN
";

    #[test]
    fn reads_each_bgp_session_and_nothing_else() {
        let sessions = parse(SHOW);
        assert_eq!(sessions.len(), 2);
        let up = &sessions["peer_tor_1"];
        assert!(up.is_established());
        assert_eq!(up.routes_exported, 2);
        let down = &sessions["peer_bad_2"];
        assert_eq!(down.state, "Active");
        assert_eq!(down.last_error, "Socket: Connection refused");
        assert_eq!(why_down(down, false, false).0.name(), "ConnectionRefused");
    }

    #[test]
    fn a_silent_router_with_a_password_points_at_the_password() {
        let silent = Session {
            state: "Connect".into(),
            ..Session::default()
        };
        assert_eq!(
            why_down(&silent, true, true).0.name(),
            "AuthenticationFailed"
        );
        assert!(why_down(&silent, true, false).1.contains("password"));
        let mismatch = Session {
            last_error: "Received: Bad peer AS".into(),
            ..silent
        };
        assert_eq!(why_down(&mismatch, true, true).0.name(), "ASNMismatch");
    }
}
