//! The owner index of a node allocator: owner name -> where its address lives, in about 60
//! bytes per live allocation at a million of them (names included).
//!
//! A `HashMap<Box<str>, Slot>` costs a heap string per owner plus, at a million entries, a
//! table of 2^21 24-byte buckets, about 85 bytes in all. Here the table holds 4-byte record ids,
//! records are 16 bytes in one vector, and names live in 64 KiB arena chunks; released names
//! are reclaimed by compacting the arena once half of it is garbage.

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

/// Where an allocation lives: block index and offset in the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub block: u32,
    pub offset: u32,
}

const CHUNK: usize = 64 * 1024;
/// Longest owner name accepted (CNI container ids and pod names are far shorter).
pub const MAX_OWNER_LEN: usize = 1024;
const FREE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Record {
    chunk: u32,
    start: u16,
    len: u16,
    slot: Slot,
}

#[derive(Debug, Clone, Default)]
pub struct OwnerIndex {
    table: HashTable<u32>,
    records: Vec<Record>,
    free: Vec<u32>,
    chunks: Vec<Vec<u8>>,
    garbage: usize,
    live_bytes: usize,
    hasher: DefaultHashBuilder,
}

impl OwnerIndex {
    fn name(&self, r: &Record) -> &[u8] {
        &self.chunks[r.chunk as usize][r.start as usize..r.start as usize + r.len as usize]
    }

    fn hash(&self, name: &[u8]) -> u64 {
        self.hasher.hash_one(name)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<Slot> {
        let hash = self.hash(name.as_bytes());
        self.table
            .find(hash, |&id| {
                self.name(&self.records[id as usize]) == name.as_bytes()
            })
            .map(|&id| self.records[id as usize].slot)
    }

    /// Adds `name` (which must not be present) at `slot`.
    pub fn insert(&mut self, name: &str, slot: Slot) {
        assert!(
            name.len() <= MAX_OWNER_LEN,
            "owner names are checked before allocation"
        );
        let (chunk, start) = self.store_name(name.as_bytes());
        let record = Record {
            chunk,
            start,
            len: name.len() as u16,
            slot,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.records[id as usize] = record;
                id
            }
            None => {
                self.records.push(record);
                (self.records.len() - 1) as u32
            }
        };
        self.live_bytes += name.len();
        let hash = self.hash(name.as_bytes());
        let (records, chunks, hasher) = (&self.records, &self.chunks, &self.hasher);
        self.table.insert_unique(hash, id, |&id| {
            let r = &records[id as usize];
            hasher.hash_one(
                &chunks[r.chunk as usize][r.start as usize..r.start as usize + r.len as usize],
            )
        });
    }

    pub fn remove(&mut self, name: &str) -> Option<Slot> {
        let hash = self.hash(name.as_bytes());
        let (records, chunks) = (&self.records, &self.chunks);
        let entry = self
            .table
            .find_entry(hash, |&id| {
                let r = &records[id as usize];
                &chunks[r.chunk as usize][r.start as usize..r.start as usize + r.len as usize]
                    == name.as_bytes()
            })
            .ok()?;
        let (id, _) = entry.remove();
        let record = &mut self.records[id as usize];
        let slot = record.slot;
        record.slot.block = FREE;
        self.free.push(id);
        self.garbage += name.len();
        self.live_bytes -= name.len();
        if self.garbage > CHUNK && self.garbage > self.live_bytes {
            self.compact();
        }
        Some(slot)
    }

    /// Every live (name, slot).
    pub fn iter(&self) -> impl Iterator<Item = (&str, Slot)> {
        self.records
            .iter()
            .filter(|r| r.slot.block != FREE)
            .map(|r| {
                (
                    std::str::from_utf8(self.name(r)).expect("names are stored from &str"),
                    r.slot,
                )
            })
    }

    /// Changes the block number of every slot in `from` to `to` (a block moved position).
    pub fn renumber_block(&mut self, from: u32, to: u32) {
        for r in &mut self.records {
            if r.slot.block == from {
                r.slot.block = to;
            }
        }
    }

    fn store_name(&mut self, name: &[u8]) -> (u32, u16) {
        let fits = self
            .chunks
            .last()
            .is_some_and(|c| c.len() + name.len() <= CHUNK);
        if !fits {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        let chunk = self.chunks.len() - 1;
        let c = &mut self.chunks[chunk];
        let start = c.len();
        c.extend_from_slice(name);
        (chunk as u32, start as u16)
    }

    /// Rewrites the arena with live names only (ids and the table stay valid).
    fn compact(&mut self) {
        let old = std::mem::take(&mut self.chunks);
        for i in 0..self.records.len() {
            let r = self.records[i];
            if r.slot.block == FREE {
                continue;
            }
            let name =
                old[r.chunk as usize][r.start as usize..r.start as usize + r.len as usize].to_vec();
            let (chunk, start) = self.store_name(&name);
            self.records[i].chunk = chunk;
            self.records[i].start = start;
        }
        self.garbage = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn behaves_like_a_map_through_churn_and_compaction() {
        let mut idx = OwnerIndex::default();
        let mut model: HashMap<String, Slot> = HashMap::new();
        let mut seed = 7u64;
        for step in 0..200_000u32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let name = format!("ns-{}/pod-{}", seed % 7, seed % 5000);
            if seed.is_multiple_of(3) {
                assert_eq!(idx.remove(&name), model.remove(&name), "step {step}");
            } else if let std::collections::hash_map::Entry::Vacant(e) = model.entry(name.clone()) {
                let slot = Slot {
                    block: (seed % 4) as u32,
                    offset: step,
                };
                idx.insert(&name, slot);
                e.insert(slot);
            }
            if step % 10_000 == 0 {
                assert_eq!(idx.len(), model.len());
                for (n, s) in &model {
                    assert_eq!(idx.get(n), Some(*s));
                }
                assert_eq!(idx.iter().count(), model.len());
            }
        }
        idx.renumber_block(3, 9);
        for (n, s) in &model {
            let want = if s.block == 3 {
                Slot {
                    block: 9,
                    offset: s.offset,
                }
            } else {
                *s
            };
            assert_eq!(idx.get(n), Some(want));
        }
    }
}
