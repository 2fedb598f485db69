//! The node's allocation log: an append-only file of CRC-framed records, one `fdatasync` per
//! batch of changes, replayed on open, compacted by writing a snapshot to a new file and
//! renaming it over the old one.
//!
//! Why not the embedded database the cluster store uses: a redb commit copies B-tree pages and
//! spent ~1.45 ms of CPU per batch here (fsync itself: ~0.2 ms), which made the CPU, not the disk,
//! the limit of durable allocations. Appending a few dozen bytes per change leaves the fsync.
//!
//! Crash safety: a batch is acknowledged only after `fdatasync` returned. A crash mid-batch
//! leaves a torn tail (a short or corrupt record) that replay detects by length and CRC and
//! cuts off; those changes were never acknowledged. A failed write is cut off the same way
//! before the error is returned, so the file always matches what was acknowledged.

use std::{
    fs::{File, OpenOptions},
    io::{Read as _, Write as _},
    path::{Path, PathBuf},
};

use crate::atomic_file;

const MAGIC: &[u8; 8] = b"IPAMLOG1";
const HEADER: u64 = MAGIC.len() as u64;
/// Largest record accepted on replay: owner names are at most 1 KiB.
const MAX_RECORD: u32 = 4096;

/// One change to the node's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Put { key: String, value: Vec<u8> },
    Delete { key: String },
}

impl Record {
    fn encode(&self, out: &mut Vec<u8>) {
        let mut payload = Vec::with_capacity(64);
        let (op, key, value): (u8, &str, &[u8]) = match self {
            Record::Put { key, value } => (1, key, value),
            Record::Delete { key } => (2, key, &[]),
        };
        payload.push(op);
        payload.extend_from_slice(&(key.len() as u16).to_le_bytes());
        payload.extend_from_slice(key.as_bytes());
        payload.extend_from_slice(&(value.len() as u16).to_le_bytes());
        payload.extend_from_slice(value);
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
    }

    fn decode(payload: &[u8]) -> Option<Self> {
        let op = *payload.first()?;
        let klen = u16::from_le_bytes(payload.get(1..3)?.try_into().ok()?) as usize;
        let key = std::str::from_utf8(payload.get(3..3 + klen)?)
            .ok()?
            .to_owned();
        let at = 3 + klen;
        let vlen = u16::from_le_bytes(payload.get(at..at + 2)?.try_into().ok()?) as usize;
        let value = payload.get(at + 2..at + 2 + vlen)?.to_vec();
        if at + 2 + vlen != payload.len() {
            return None;
        }
        match op {
            1 => Some(Record::Put { key, value }),
            2 => Some(Record::Delete { key }),
            _ => None,
        }
    }
}

pub struct AllocLog {
    path: PathBuf,
    file: File,
    len: u64,
    /// Set when a failed write could not be cut off: nothing more may be appended.
    poisoned: bool,
}

/// What replay found: records in order, and whether a torn tail was cut off.
pub struct Replay {
    pub records: Vec<Record>,
    pub torn_tail_bytes: u64,
}

impl AllocLog {
    /// Opens (creating) the log and replays it.
    pub fn open(path: &Path) -> std::io::Result<(Self, Replay)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        if bytes.is_empty() {
            file.write_all(MAGIC)?;
            file.sync_all()?;
            atomic_file::sync_dir(path)?;
            bytes.extend_from_slice(MAGIC);
        }
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not an allocation log (bad header); move the file away to start empty",
            ));
        }
        let mut records = Vec::new();
        let mut at = MAGIC.len();
        while let Some(header) = bytes.get(at..at + 8) {
            let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
            let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
            let Some(payload) = bytes.get(at + 8..at + 8 + len as usize) else {
                break;
            };
            if len > MAX_RECORD || crc32fast::hash(payload) != crc {
                break;
            }
            let Some(record) = Record::decode(payload) else {
                break;
            };
            records.push(record);
            at += 8 + len as usize;
        }
        let torn = (bytes.len() - at) as u64;
        if torn > 0 {
            file.set_len(at as u64)?;
            file.sync_all()?;
        }
        Ok((
            Self {
                path: path.to_owned(),
                file,
                len: at as u64,
                poisoned: false,
            },
            Replay {
                records,
                torn_tail_bytes: torn,
            },
        ))
    }

    /// Bytes in the log (header included).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == HEADER
    }

    /// Appends `records` durably: returns once they are on disk.
    pub fn append(&mut self, records: &[Record]) -> std::io::Result<()> {
        if self.poisoned {
            return Err(std::io::Error::other(
                "an earlier write failed and could not be undone; restart the daemon to replay the log",
            ));
        }
        let mut buf = Vec::with_capacity(records.len() * 64);
        for r in records {
            r.encode(&mut buf);
        }
        let result = (|| {
            use std::os::unix::fs::FileExt as _;
            self.file.write_all_at(&buf, self.len)?;
            self.file.sync_data()
        })();
        match result {
            Ok(()) => {
                self.len += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Cut off whatever part of the batch reached the file.
                if self
                    .file
                    .set_len(self.len)
                    .and_then(|()| self.file.sync_all())
                    .is_err()
                {
                    self.poisoned = true;
                }
                Err(e)
            }
        }
    }

    /// Replaces the log with `snapshot` (the current state as puts), atomically: a new file is
    /// written and synced, renamed over the old one, and the directory synced.
    pub fn compact(&mut self, snapshot: &[Record]) -> std::io::Result<()> {
        let mut buf = MAGIC.to_vec();
        for r in snapshot {
            r.encode(&mut buf);
        }
        // After the rename the old handle points at an unlinked file: switch handles at once.
        self.file = atomic_file::replace(&self.path, &buf)?;
        self.len = buf.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::TempPath;

    fn put(k: &str, v: &[u8]) -> Record {
        Record::Put {
            key: k.into(),
            value: v.to_vec(),
        }
    }

    #[test]
    fn replays_in_order_and_cuts_a_torn_tail() {
        let path = TempPath::new("alloclog.log");
        {
            let (mut log, replay) = AllocLog::open(&path).unwrap();
            assert!(replay.records.is_empty());
            log.append(&[put("a", b"1"), put("b", b"2")]).unwrap();
            log.append(&[Record::Delete { key: "a".into() }]).unwrap();
        }
        // A crash in the middle of the next batch: half a record at the end.
        let good = std::fs::metadata(&*path).unwrap().len();
        let mut torn = Vec::new();
        put("c", b"3").encode(&mut torn);
        let mut f = OpenOptions::new().append(true).open(&*path).unwrap();
        f.write_all(&torn[..torn.len() - 2]).unwrap();
        drop(f);
        let (mut log, replay) = AllocLog::open(&path).unwrap();
        assert_eq!(
            replay.records,
            vec![
                put("a", b"1"),
                put("b", b"2"),
                Record::Delete { key: "a".into() }
            ]
        );
        assert_eq!(replay.torn_tail_bytes, torn.len() as u64 - 2);
        assert_eq!(
            std::fs::metadata(&*path).unwrap().len(),
            good,
            "torn tail cut off"
        );
        // A flipped bit in the last record is caught by the CRC, too.
        log.append(&[put("d", b"4")]).unwrap();
        drop(log);
        let mut bytes = std::fs::read(&*path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&*path, &bytes).unwrap();
        let (_, replay) = AllocLog::open(&path).unwrap();
        assert_eq!(replay.records.len(), 3);
    }

    #[test]
    fn compaction_keeps_exactly_the_snapshot() {
        let path = TempPath::new("alloclog-compact.log");
        let (mut log, _) = AllocLog::open(&path).unwrap();
        for i in 0..100 {
            log.append(&[
                put(&format!("k{i}"), b"x"),
                Record::Delete {
                    key: format!("k{i}"),
                },
            ])
            .unwrap();
        }
        let before = log.len();
        log.compact(&[put("live", b"ip")]).unwrap();
        assert!(log.len() < before);
        log.append(&[put("after", b"y")]).unwrap();
        drop(log);
        let (_, replay) = AllocLog::open(&path).unwrap();
        assert_eq!(replay.records, vec![put("live", b"ip"), put("after", b"y")]);
    }

    #[test]
    fn a_file_that_is_not_a_log_is_refused_not_overwritten() {
        let path = TempPath::new("alloclog-foreign.log");
        std::fs::write(&*path, b"some other file").unwrap();
        let e = AllocLog::open(&path).err().unwrap().to_string();
        assert!(e.contains("not an allocation log"), "{e}");
        assert_eq!(std::fs::read(&*path).unwrap(), b"some other file");
    }
}
