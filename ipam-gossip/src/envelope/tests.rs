use std::sync::Arc;

use super::*;

const NOW: u64 = 1_800_000_000_000_000;

fn keyring(sign: &[u8; 32], accept: &[&[u8; 32]]) -> Keyring {
    Keyring::new(("new", sign), accept.iter().map(|k| ("old", k.as_slice()))).unwrap()
}

const A: &str = "10.0.0.1:7946";
const B: &str = "[fd00::2]:7946";
const C: &str = "10.0.0.3:7946";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The node keys of A, B and C (1, 2, 3), and of Mallory, a compromised node (66).
fn node_key(n: u8) -> NodeKey {
    NodeKey::from_seed(&[n; 32])
}

/// The records of A, B and C, each publishing its key.
fn records() -> Signers {
    [(A, 1), (B, 2), (C, 3)]
        .into_iter()
        .map(|(at, n)| (addr(at).ip(), Speaker::Signed(node_key(n).public())))
        .collect()
}

/// The member at `at` with node key `n`, reading `signers`.
fn member_with(keyring: Keyring, n: u8, at: &str, signers: Signers) -> Envelope {
    let mut envelope = Envelope::new(keyring, node_key(n), addr(at));
    envelope.set_signers(Arc::new(signers));
    envelope
}

fn member(keyring: Keyring, n: u8, at: &str) -> Envelope {
    member_with(keyring, n, at, records())
}

fn pair(a: Keyring, b: Keyring) -> (Envelope, Envelope) {
    (member(a, 1, A), member(b, 2, B))
}

/// `packet` with bytes `at` replaced by `with` and its tag made again under `keyring` for
/// `recipient`: what a holder of the cluster key can forge.
fn retagged(packet: &[u8], at: usize, with: &[u8], keyring: &Keyring, recipient: &str) -> Vec<u8> {
    let mut forged = packet[..packet.len() - V3.tag].to_vec();
    forged[at..at + with.len()].copy_from_slice(with);
    let tag = with_suffix(&mut forged, &address_bytes(addr(recipient)), |tagged| {
        hmac::sign(&keyring.sign.hmac, tagged)
    });
    forged.extend_from_slice(&tag.as_ref()[..V3.tag]);
    forged
}

#[test]
fn a_sealed_message_opens_once_with_its_sender_and_never_again() {
    let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
    let packet = a.seal(NOW, addr(B), b"hello");
    assert_eq!(packet.len(), OVERHEAD + 5);
    let (sender, message) = b.open(NOW + 10, &packet).unwrap();
    assert_eq!(sender, addr(A));
    assert_eq!(message, b"hello");
    assert_eq!(b.open(NOW + 20, &packet), Err(Dropped::Replayed));
    // The other way, over IPv6.
    let back = b.seal(NOW, addr(A), b"hi");
    assert_eq!(a.open(NOW, &back).unwrap().0, addr(B));
}

#[test]
fn forged_corrupted_foreign_stale_and_short_packets_are_dropped_for_their_reason() {
    let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
    let mut stranger = member(keyring(&[9; 32], &[]), 1, A);
    assert_eq!(
        b.open(NOW, &stranger.seal(NOW, addr(B), b"x")),
        Err(Dropped::UnknownKey)
    );

    let packet = a.seal(NOW, addr(B), b"you are dead");
    let mut flipped = packet.clone();
    flipped[OVERHEAD - V3.tag] ^= 1;
    assert_eq!(b.open(NOW, &flipped), Err(Dropped::BadTag));
    // A sender rewritten to pass the message off as another node's.
    let mut moved = packet.clone();
    moved[V3.sender + 15] ^= 1;
    assert_eq!(b.open(NOW, &moved), Err(Dropped::BadTag));
    // A cluster key id copied from the real key does not help without the key.
    let mut forged = stranger.seal(NOW, addr(B), b"you are dead");
    forged[3..7].copy_from_slice(&packet[3..7]);
    assert_eq!(b.open(NOW, &forged), Err(Dropped::BadTag));
    // The signature is under the tag: a holder of the cluster key must tag again to change it.
    let mut resigned = packet.clone();
    resigned[OVERHEAD - V3.tag - 1] ^= 1;
    assert_eq!(b.open(NOW, &resigned), Err(Dropped::BadTag));
    let cluster = keyring(&[1; 32], &[]);
    let at = packet.len() - V3.tag - 1;
    let flipped_signature = [packet[at] ^ 1];
    assert_eq!(
        b.open(NOW, &retagged(&packet, at, &flipped_signature, &cluster, B)),
        Err(Dropped::BadSignature)
    );

    let skew = u64::try_from(MAX_CLOCK_SKEW.as_micros()).unwrap();
    let old = a.seal(NOW, addr(B), b"x");
    assert_eq!(b.open(NOW + skew + 1_000_000, &old), Err(Dropped::Stale));
    assert_eq!(
        b.open(NOW, &packet[..OVERHEAD - 1]),
        Err(Dropped::Truncated)
    );
    assert_eq!(b.open(NOW, &[0; OVERHEAD]), Err(Dropped::NotGossip));
    let mut version_one = packet.clone();
    version_one[2] = 1;
    assert_eq!(b.open(NOW, &version_one), Err(Dropped::OtherVersion));
    // None of that spoiled the genuine packet.
    assert!(b.open(NOW, &packet).is_ok());
}

#[test]
fn a_packet_to_one_member_replayed_to_another_is_dropped_there() {
    let ring = || keyring(&[1; 32], &[]);
    let (mut a, mut b) = pair(ring(), ring());
    let mut c = member(ring(), 3, C);
    let to_c = a.seal(NOW, addr(C), b"ping");
    assert_eq!(b.open(NOW, &to_c), Err(Dropped::Misaddressed));
    // B's window was not touched: A's next packet to B is taken, and C takes its own.
    assert!(b.open(NOW, &a.seal(NOW, addr(B), b"ping")).is_ok());
    assert_eq!(c.open(NOW, &to_c).unwrap().0, addr(A));
}

#[test]
fn reordered_packets_within_the_window_are_accepted_once_each() {
    let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
    // Sealed over two seconds of the sender's clock: the window counts packets, not time.
    let packets: Vec<_> = (0..70)
        .map(|i| a.seal(NOW + i * 30_000, addr(B), b"m"))
        .collect();
    let at = NOW + 70 * 30_000;
    b.open(at, &packets[69]).unwrap();
    // Every one of the 64 before the newest still arrives, in any order.
    for p in packets[5..69].iter().rev() {
        b.open(at, p).unwrap();
    }
    for p in &packets[5..] {
        assert_eq!(b.open(at, p), Err(Dropped::Replayed));
    }
    // 65 behind the newest: out of the window, refused as it cannot be told from a replay.
    assert_eq!(b.open(at, &packets[4]), Err(Dropped::Replayed));
}

#[test]
fn a_jump_of_exactly_the_window_keeps_the_previous_newest_refused() {
    let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
    let packets: Vec<_> = (0..=REPLAY_WINDOW)
        .map(|i| a.seal(NOW + i, addr(B), b"m"))
        .collect();
    b.open(NOW, &packets[0]).unwrap();
    // The newest is exactly REPLAY_WINDOW ahead: the first is at the window's edge.
    b.open(NOW, &packets[REPLAY_WINDOW as usize]).unwrap();
    assert_eq!(b.open(NOW, &packets[0]), Err(Dropped::Replayed));
    // Those in between were never seen: each is taken once.
    b.open(NOW, &packets[1]).unwrap();
    assert_eq!(b.open(NOW, &packets[1]), Err(Dropped::Replayed));
}

/// A packet of A's with a counter near the end of time (sealed with A's key: since envelope
/// v3 no other node can): dropped as ahead, and A's packets are taken as before. (Before the
/// bound, it moved A's window there, and every real packet of A was dropped as replayed until
/// B restarted.)
#[test]
fn a_counter_ahead_of_the_clock_by_more_than_the_skew_is_dropped_and_changes_nothing() {
    let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
    let far_ahead = member(keyring(&[1; 32], &[]), 1, A);
    b.open(NOW, &a.seal(NOW, addr(B), b"m")).unwrap();
    let skew = micros(MAX_CLOCK_SKEW);
    for counter in [u64::MAX - 1, u64::MAX, NOW + skew + 1] {
        let forged = far_ahead.seal_with_counter(NOW, addr(B), counter, b"you are dead");
        assert_eq!(b.open(NOW, &forged), Err(Dropped::Ahead), "{counter}");
    }
    for at in [NOW + 1, NOW + 2] {
        assert!(b.open(at, &a.seal(at, addr(B), b"m")).is_ok());
    }
    // At the edge of the skew it cannot be told from a sender whose clock is that far
    // ahead: taken (the next test bounds what that costs).
    let edge = far_ahead.seal_with_counter(NOW, addr(B), NOW + skew, b"x");
    assert!(b.open(NOW, &edge).is_ok());
}

/// The most a counter pushed ahead can do: push A's window to the clock and the skew. A's
/// counter starts again from its clock once it is REANCHOR_AFTER behind it, so B takes A's
/// packets again within the skew and REANCHOR_AFTER; none of A's packets is ever ahead.
#[test]
fn a_window_pushed_to_the_edge_of_the_skew_takes_its_sender_again_within_a_bound() {
    let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
    let far_ahead = member(keyring(&[1; 32], &[]), 1, A);
    let skew = micros(MAX_CLOCK_SKEW);
    let second = 1_000_000;
    b.open(NOW, &a.seal(NOW, addr(B), b"m")).unwrap();
    let forged = far_ahead.seal_with_counter(NOW, addr(B), NOW + skew, b"x");
    b.open(NOW, &forged).unwrap();
    // A sends a packet every half second, as a member probing B would.
    let mut back = None;
    for step in 1..200 {
        let at = NOW + step * second / 2;
        match b.open(at, &a.seal(at, addr(B), b"m")) {
            Ok(_) => {
                back = Some(at);
                break;
            }
            Err(e) => assert_eq!(e, Dropped::Replayed, "at {}", at - NOW),
        }
    }
    let back = back.expect("A's packets are never taken again") - NOW;
    let bound = skew + micros(REANCHOR_AFTER) + second / 2;
    assert!(back <= bound, "taken again after {back} µs (bound {bound})");

    // A's clock set back by more than the skew after it ran ahead: its counter starts
    // again from the clock rather than stay where B would drop it as ahead.
    let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
    let ahead = a.seal(NOW + 3 * skew, addr(B), b"m");
    assert_eq!(b.open(NOW, &ahead), Err(Dropped::Stale));
    assert!(b.open(NOW, &a.seal(NOW, addr(B), b"m")).is_ok());
}

/// A sender that is no longer a member is forgotten once every packet taken from it is
/// stale, not sooner: its packets replayed after that are dropped as stale, never taken as
/// new by an empty window. A member is never forgotten.
#[test]
fn a_forgotten_sender_s_packets_replayed_are_still_dropped() {
    let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
    let skew = micros(MAX_CLOCK_SKEW);
    let forget = micros(FORGET_AFTER);
    // The worst case: A's clock at the edge of the skew ahead of B's.
    let packets: Vec<_> = (0..3)
        .map(|i| {
            let p = a.seal(NOW + skew + i, addr(B), b"m");
            b.open(NOW + i, &p).unwrap();
            p
        })
        .collect();
    let last_taken = NOW + 2;
    let _ = b.seal(NOW, addr(A), b"back");
    b.forget(last_taken + 10 * forget, |_| true);
    assert!(b.remembers_sender(addr(A)), "a member is kept");
    b.forget(last_taken + forget, |_| false);
    assert!(
        b.remembers_sender(addr(A)),
        "kept until all it sent is stale"
    );
    assert_eq!(
        b.open(last_taken + forget, &packets[2]),
        Err(Dropped::Replayed)
    );
    let later = last_taken + forget + 1;
    b.forget(later, |_| false);
    assert!(!b.remembers_sender(addr(A)));
    assert_eq!(b.remembered(), (0, 0));
    for p in &packets {
        assert_eq!(b.open(later, p), Err(Dropped::Stale));
    }
    // A, sending again, is taken.
    assert!(b.open(later, &a.seal(later, addr(B), b"m")).is_ok());
}

#[test]
fn a_restarted_sender_is_heard_and_its_old_packets_are_not() {
    let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
    let before: Vec<_> = (0..3).map(|_| a.seal(NOW, addr(B), b"m")).collect();
    for p in &before {
        b.open(NOW, p).unwrap();
    }
    // The same member a second later, as a new process: its counter starts from its clock.
    let mut restarted = member(keyring(&[1; 32], &[]), 1, A);
    let after = restarted.seal(NOW + 1_000_000, addr(B), b"m");
    assert!(b.open(NOW + 1_000_000, &after).is_ok());
    assert_eq!(b.open(NOW + 1_000_000, &before[2]), Err(Dropped::Replayed));
}

#[test]
fn a_rotation_accepts_old_and_new_and_signs_with_the_new() {
    let old = [3; 32];
    let new = [4; 32];
    let (mut rotated, mut not_yet) = pair(keyring(&new, &[&old]), keyring(&old, &[&new]));
    assert!(not_yet.open(NOW, &rotated.seal(NOW, addr(B), b"a")).is_ok());
    assert!(rotated.open(NOW, &not_yet.seal(NOW, addr(A), b"b")).is_ok());
    // Once the old key is dropped, packets signed with it are refused.
    rotated.set_keyring(keyring(&new, &[]));
    assert_eq!(
        rotated.open(NOW, &not_yet.seal(NOW + 1, addr(A), b"c")),
        Err(Dropped::UnknownKey)
    );
}

#[test]
fn short_and_duplicate_keys_are_refused_by_name() {
    let short = Keyring::new(("gossip.key", &[1; 16]), []).err().unwrap();
    assert!(
        short.to_string().contains("gossip.key is 16 bytes"),
        "{short}"
    );
    let twice = Keyring::new(("a", &[1; 32]), [("b", [1; 32].as_slice())])
        .err()
        .unwrap();
    assert_eq!(
        twice,
        KeyError::Duplicate {
            first: "a".into(),
            second: "b".into()
        }
    );
}

/// Mallory holds the cluster key and a node key of her own (a compromised node). Whatever she
/// seals in A's name is dropped, signed by her, with A's key id copied, or unsigned; and none
/// of it touches A's replay window, however far ahead its counter.
#[test]
fn a_node_of_the_cluster_cannot_speak_as_another() {
    let cluster = || keyring(&[1; 32], &[]);
    let (mut a, mut b) = pair(cluster(), cluster());
    let skew = micros(MAX_CLOCK_SKEW);
    b.open(NOW, &a.seal(NOW, addr(B), b"m")).unwrap();

    // Signed with her own key, naming A as the sender.
    let mallory = member(cluster(), 66, A);
    let own_key = mallory.seal_with_counter(NOW, addr(B), NOW + skew, b"C is dead");
    assert_eq!(b.open(NOW, &own_key), Err(Dropped::UnknownSigner));
    // A's key id copied in, the tag made again: the signature is still hers.
    let a_id = node_key(1).public().id().0;
    let copied = retagged(&own_key, 7, &a_id, &cluster(), B);
    assert_eq!(b.open(NOW, &copied), Err(Dropped::BadSignature));
    // Unsigned (version 2), as if A ran the previous release: A's record says it signs.
    let believes_b_old = member_with(
        cluster(),
        66,
        A,
        [(addr(B).ip(), Speaker::Unsigned)].into_iter().collect(),
    );
    let unsigned = believes_b_old.seal_with_counter(NOW, addr(B), NOW + skew, b"C is dead");
    assert_eq!(unsigned.len(), OVERHEAD_V2 + 9);
    assert_eq!(b.open(NOW, &unsigned), Err(Dropped::Unsigned));

    // A's window was not moved: A's next packets are taken.
    for at in [NOW + 1, NOW + 2] {
        assert!(b.open(at, &a.seal(at, addr(B), b"m")).is_ok());
    }
    // Signed as herself from her own address, she is heard: she speaks only as herself.
    let with_mallory_at_c = [(A, 1), (B, 2), (C, 66)]
        .into_iter()
        .map(|(at, n)| (addr(at).ip(), Speaker::Signed(node_key(n).public())))
        .collect();
    let mut b = member_with(cluster(), 2, B, with_mallory_at_c);
    let mut mallory = member(cluster(), 66, C);
    assert_eq!(
        b.open(NOW, &mallory.seal(NOW, addr(B), b"hi")).unwrap().0,
        addr(C)
    );
}

/// Between an agent of this release and one of the previous (its record publishes no key),
/// both ways go as version 2; an address no record lists, or two do, is heard from by no one;
/// a record whose key cannot be read is not taken as unsigned.
#[test]
fn the_previous_release_is_spoken_to_unsigned_and_strangers_not_at_all() {
    let cluster = || keyring(&[1; 32], &[]);
    let with_old_b: Signers = [
        (addr(A).ip(), Speaker::Signed(node_key(1).public())),
        (addr(B).ip(), Speaker::Unsigned),
    ]
    .into_iter()
    .collect();
    let mut a = member_with(cluster(), 1, A, with_old_b);
    // The previous release takes any version 2 sealed with the cluster key: its stand-in here
    // is this release's envelope with every address unsigned.
    let every_address_unsigned: Signers = [
        (addr(A).ip(), Speaker::Unsigned),
        (addr(B).ip(), Speaker::Unsigned),
    ]
    .into_iter()
    .collect();
    let mut old_b = member_with(cluster(), 2, B, every_address_unsigned);
    let to_old = a.seal(NOW, addr(B), b"ping");
    assert_eq!(to_old.len(), OVERHEAD_V2 + 4);
    assert_eq!(old_b.open(NOW, &to_old).unwrap().0, addr(A));
    assert_eq!(
        a.open(NOW, &old_b.seal(NOW, addr(A), b"ack")).unwrap().0,
        addr(B)
    );

    // Nobody's address: not in the records, or claimed by two (left out of the table).
    let mut b = member(cluster(), 2, B);
    let mut stranger = member(cluster(), 9, "10.0.0.99:7946");
    assert_eq!(
        b.open(NOW, &stranger.seal(NOW, addr(B), b"x")),
        Err(Dropped::UnknownSender)
    );
    // A record whose key cannot be read: not unsigned, not signed.
    let unreadable: Signers = [
        (addr(A).ip(), Speaker::Unreadable),
        (addr(B).ip(), Speaker::Signed(node_key(2).public())),
    ]
    .into_iter()
    .collect();
    let mut b = member_with(cluster(), 2, B, unreadable.clone());
    let mut a_unsigned = member_with(
        cluster(),
        1,
        A,
        [(addr(B).ip(), Speaker::Unsigned)].into_iter().collect(),
    );
    assert_eq!(
        b.open(NOW, &a_unsigned.seal(NOW, addr(B), b"x")),
        Err(Dropped::Unsigned)
    );
    let mut a = member_with(cluster(), 1, A, unreadable);
    assert_eq!(
        b.open(NOW, &a.seal(NOW + 1, addr(B), b"x")),
        Err(Dropped::UnknownSigner)
    );
}

/// An agent that restarts has a new key; its record publishes it before its first packet. A
/// receiver that has not seen the record yet drops the new agent's packets as from an unknown
/// signer, and takes them once it has; the old key's packets are refused from then on.
#[test]
fn a_restart_is_a_new_key_taken_once_the_record_shows_it() {
    let cluster = || keyring(&[1; 32], &[]);
    let (mut a, mut b) = pair(cluster(), cluster());
    let before = a.seal(NOW, addr(B), b"m");
    let mut restarted = member(cluster(), 11, A);
    let after = restarted.seal(NOW + 1_000_000, addr(B), b"m");
    assert_eq!(b.open(NOW + 1_000_000, &after), Err(Dropped::UnknownSigner));
    b.set_signers(Arc::new(
        [
            (addr(A).ip(), Speaker::Signed(node_key(11).public())),
            (addr(B).ip(), Speaker::Signed(node_key(2).public())),
        ]
        .into_iter()
        .collect(),
    ));
    assert!(b.open(NOW + 1_000_000, &after).is_ok());
    assert_eq!(
        b.open(NOW + 1_000_000, &before),
        Err(Dropped::UnknownSigner)
    );
}

/// A packet sealed for C with its recipient id rewritten to B's (by a holder of the cluster
/// key, who can tag it again): B signs and tags over its own address, so the signature fails.
#[test]
fn a_packet_readdressed_to_another_member_fails_its_signature() {
    let cluster = || keyring(&[1; 32], &[]);
    let (mut a, mut b) = pair(cluster(), cluster());
    let to_c = a.seal(NOW, addr(C), b"ping");
    let b_id = node_key(2).public().id().0;
    let readdressed = retagged(&to_c, V3.recipient, &b_id, &cluster(), B);
    assert_eq!(b.open(NOW, &readdressed), Err(Dropped::BadSignature));
}

/// Before A's record published a key, a holder of the cluster key sealed a packet as A
/// (version 2) with a counter at the edge of the skew, and B took it. Once A's record
/// publishes its key, A's signed packets go through a window of their own: taken at once.
#[test]
fn what_was_taken_unsigned_does_not_push_the_signed_window() {
    let cluster = || keyring(&[1; 32], &[]);
    let unsigned_a: Signers = [
        (addr(A).ip(), Speaker::Unsigned),
        (addr(B).ip(), Speaker::Signed(node_key(2).public())),
    ]
    .into_iter()
    .collect();
    let mut b = member_with(cluster(), 2, B, unsigned_a);
    let forger = member_with(
        cluster(),
        66,
        A,
        [(addr(B).ip(), Speaker::Unsigned)].into_iter().collect(),
    );
    let skew = micros(MAX_CLOCK_SKEW);
    let pushed = forger.seal_with_counter(NOW, addr(B), NOW + skew, b"x");
    assert!(b.open(NOW, &pushed).is_ok());
    b.set_signers(Arc::new(records()));
    let mut a = member(cluster(), 1, A);
    assert!(b.open(NOW + 1, &a.seal(NOW + 1, addr(B), b"m")).is_ok());
    assert_eq!(b.open(NOW + 2, &pushed), Err(Dropped::Unsigned));
}

/// A node's own address on another port is nobody: every member gossips on one port.
#[test]
fn another_port_of_a_signed_address_is_nobody() {
    let (_, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
    let mut a_elsewhere = member(keyring(&[1; 32], &[]), 1, "10.0.0.1:7947");
    assert_eq!(
        b.open(NOW, &a_elsewhere.seal(NOW, addr(B), b"m")),
        Err(Dropped::UnknownSender)
    );
}

/// A sender restarting again and again (a new key each time) keeps one window at a receiver,
/// not one per start.
#[test]
fn a_sender_keeps_one_window_however_often_it_restarts() {
    let cluster = || keyring(&[1; 32], &[]);
    let mut b = member(cluster(), 2, B);
    for start in 0..5u8 {
        let a_key = 100 + start;
        b.set_signers(Arc::new(
            [
                (addr(A).ip(), Speaker::Signed(node_key(a_key).public())),
                (addr(B).ip(), Speaker::Signed(node_key(2).public())),
            ]
            .into_iter()
            .collect(),
        ));
        let mut a = member(cluster(), a_key, A);
        let at = NOW + u64::from(start) * 1_000_000;
        assert!(b.open(at, &a.seal(at, addr(B), b"m")).is_ok());
        assert_eq!(b.remembered().0, 1, "windows after start {start}");
    }
}

/// Nothing is sealed for an address whose record is contested, unknown, pending or unreadable.
#[test]
fn only_addresses_a_record_says_how_to_reach_are_sent_to() {
    let table: Signers = [
        (addr(A).ip(), Speaker::Signed(node_key(1).public())),
        (addr(B).ip(), Speaker::Unsigned),
        (addr(C).ip(), Speaker::Pending),
        ("10.0.0.4".parse().unwrap(), Speaker::Unreadable),
    ]
    .into_iter()
    .collect();
    let me = member_with(keyring(&[1; 32], &[]), 9, "10.0.0.9:7946", table);
    assert!(me.can_reach(addr(A)));
    assert!(me.can_reach(addr(B)));
    assert!(!me.can_reach(addr(C)));
    assert!(!me.can_reach("10.0.0.4:7946".parse().unwrap()));
    assert!(!me.can_reach("10.0.0.5:7946".parse().unwrap()));
}
