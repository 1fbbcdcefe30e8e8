//! A bounded top-K of heavy hitters (the space-saving algorithm of
//! Metwally, Agrawal and El Abbadi).
//!
//! At most `capacity` identities are kept, whatever the number seen. When a
//! new identity arrives and the table is full, it replaces the one with the
//! smallest count and inherits that count as its possible overestimate.
//! Guarantee: every identity seen more than `total / capacity` times is in
//! the table, and a count is never lower than the true count.
//!
//! ```
//! use ratewatch::telemetry::TopK;
//! let mut top = TopK::new(2);
//! for id in ["a", "b", "c", "abuser", "abuser", "abuser"] {
//!     top.add(id, 1);
//! }
//! assert_eq!(top.top()[0].0, "abuser");
//! assert!(top.len() <= 2);
//! ```

use ahash::AHashMap;

/// A bounded table of the most frequent identities.
///
/// The entries form a binary min-heap on their counts (an index maps each
/// identity to its slot), so the smallest entry is at the root: a newcomer
/// replaces it in O(log capacity), and a hit on a heavy identity, a leaf
/// with a large count, usually moves nothing.
#[derive(Debug, Clone)]
pub struct TopK {
    capacity: usize,
    index: AHashMap<String, usize>,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    key: String,
    count: u64,
}

impl TopK {
    /// An empty table holding at most `capacity` identities (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            index: AHashMap::with_capacity(capacity),
            entries: Vec::with_capacity(capacity),
        }
    }

    /// Counts `n` more for `key`.
    pub fn add(&mut self, key: &str, n: u64) {
        if let Some(&i) = self.index.get(key) {
            self.entries[i].count += n;
            self.sift_down(i);
            return;
        }
        if self.entries.len() < self.capacity {
            let i = self.entries.len();
            self.index.insert(key.to_owned(), i);
            self.entries.push(Entry {
                key: key.to_owned(),
                count: n,
            });
            self.sift_up(i);
            return;
        }
        // Full: the smallest entry (the root) gives its slot and its count
        // to the newcomer. With many distinct identities this runs on every
        // decision: the evicted member's two strings are reused, not
        // reallocated.
        let root = &mut self.entries[0];
        let mut indexed = match self.index.remove_entry(root.key.as_str()) {
            Some((k, _)) => k,
            None => String::new(),
        };
        indexed.clear();
        indexed.push_str(key);
        root.key.clear();
        root.key.push_str(key);
        root.count += n;
        self.index.insert(indexed, 0);
        self.sift_down(0);
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.entries.swap(a, b);
        for i in [a, b] {
            if let Some(slot) = self.index.get_mut(self.entries[i].key.as_str()) {
                *slot = i;
            }
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.entries[parent].count <= self.entries[i].count {
                return;
            }
            self.swap(parent, i);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let len = self.entries.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut smallest = i;
            if l < len && self.entries[l].count < self.entries[smallest].count {
                smallest = l;
            }
            if r < len && self.entries[r].count < self.entries[smallest].count {
                smallest = r;
            }
            if smallest == i {
                return;
            }
            self.swap(i, smallest);
            i = smallest;
        }
    }

    /// The identities, highest count first.
    pub fn top(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .entries
            .iter()
            .map(|e| (e.key.clone(), e.count))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// How many identities are held (never above the capacity).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most identities it will hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Empties the table, keeping its capacity; returns what it held.
    pub fn take(&mut self) -> Vec<(String, u64)> {
        let v = self.top();
        self.entries.clear();
        self.index.clear();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_identity_seen_once_is_reported_with_its_count() {
        let mut t = TopK::new(3);
        t.add("a", 1);
        t.add("b", 2);
        assert_eq!(t.top(), vec![("b".to_string(), 2), ("a".to_string(), 1)]);
    }

    #[test]
    fn the_index_follows_every_entry_through_the_heap() {
        let mut t = TopK::new(8);
        for i in 0..500u64 {
            t.add(&format!("k{}", (i * 7919) % 23), 1 + i % 3);
            for (slot, e) in t.entries.iter().enumerate() {
                assert_eq!(t.index[&e.key], slot);
                if slot > 0 {
                    assert!(t.entries[(slot - 1) / 2].count <= e.count);
                }
            }
            assert_eq!(t.index.len(), t.entries.len());
        }
    }

    #[test]
    fn a_full_table_replaces_its_smallest_entry_and_never_grows() {
        let mut t = TopK::new(2);
        t.add("a", 5);
        t.add("b", 1);
        t.add("c", 1);
        assert_eq!(t.len(), 2);
        let top = t.top();
        assert_eq!(top[0], ("a".to_string(), 5));
        assert_eq!(top[1], ("c".to_string(), 2));
    }

    proptest! {
        #[test]
        fn a_heavy_hitter_is_always_reported_first_and_memory_stays_bounded(
            capacity in 1usize..20,
            noise in proptest::collection::vec(0u32..500, 0..400),
            heavy_every in 1usize..4,
        ) {
            let mut t = TopK::new(capacity);
            let mut heavy = 0u64;
            let mut total = 0u64;
            for (i, n) in noise.iter().enumerate() {
                t.add(&format!("k{n}"), 1);
                total += 1;
                if i % heavy_every == 0 {
                    t.add("heavy", 1);
                    heavy += 1;
                    total += 1;
                }
            }
            prop_assert!(t.len() <= capacity);
            if heavy * capacity as u64 > total {
                let top = t.top();
                let h = top.iter().find(|(k, _)| k == "heavy");
                prop_assert!(h.is_some(), "heavy hitter missing: {:?}", top);
                // Counts never underestimate.
                prop_assert!(h.map(|(_, c)| *c).unwrap_or(0) >= heavy);
            }
            if heavy * 2 > total && capacity >= 2 {
                prop_assert_eq!(&t.top()[0].0, "heavy");
            }
        }
    }
}
