//! The allocation log replayed from arbitrary bytes (a torn or corrupted file after a crash):
//! replay never panics, keeps a valid prefix, cuts the rest, and the log takes new records after.
#![no_main]

use ipam_core::pod::alloclog::{AllocLog, Record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("node.log");
    // Most inputs would fail the header check; give half of them the right one.
    let mut bytes = Vec::new();
    if data.first().is_some_and(|b| b & 1 == 1) {
        bytes.extend_from_slice(b"IPAMLOG1");
    }
    bytes.extend_from_slice(data);
    std::fs::write(&path, &bytes).expect("write");
    let Ok((log, replay)) = AllocLog::open(&path) else {
        return;
    };
    assert!(log.len() <= bytes.len().max(8) as u64);
    drop(log);
    // Replay again: what survived the first is read back whole, with nothing more to cut.
    let (mut log, again) = AllocLog::open(&path).expect("reopen");
    assert_eq!(again.torn_tail_bytes, 0);
    assert_eq!(again.records, replay.records);
    let record = Record::Put {
        key: "4 fuzz/eth0".into(),
        value: vec![10, 0, 0, 1],
    };
    log.append(std::slice::from_ref(&record)).expect("append");
    drop(log);
    let (_, after) = AllocLog::open(&path).expect("reopen after append");
    assert_eq!(after.records.len(), replay.records.len() + 1);
    assert_eq!(after.records.last(), Some(&record));
});
