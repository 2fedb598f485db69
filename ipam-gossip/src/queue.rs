//! A queue of things due at a time: the earliest first, and things due at the same time in the
//! order they were queued (so a run repeats exactly). A member's timers and the simulator's
//! packets in flight are both kept in one.

use std::{
    cmp::{Ordering, Reverse},
    collections::BinaryHeap,
    time::Duration,
};

pub(crate) struct Queue<T> {
    heap: BinaryHeap<Reverse<Entry<T>>>,
    queued: u64,
}

impl<T> Queue<T> {
    pub(crate) fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            queued: 0,
        }
    }

    pub(crate) fn push(&mut self, at: Duration, item: T) {
        self.queued += 1;
        self.heap.push(Reverse(Entry {
            at,
            order: self.queued,
            item,
        }));
    }

    /// When the earliest item is due.
    pub(crate) fn next_at(&self) -> Option<Duration> {
        self.heap.peek().map(|Reverse(e)| e.at)
    }

    /// The earliest item, if it is due by `now`.
    pub(crate) fn pop_due(&mut self, now: Duration) -> Option<T> {
        if self.next_at()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse(e)| e.item)
    }
}

struct Entry<T> {
    at: Duration,
    order: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl<T> Eq for Entry<T> {}

impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}
