//! The slot cache of one MoE layer: which experts are held, and which one to evict (least
//! recently used, or least frequently used with recency breaking ties).

use std::collections::HashMap;

/// Which expert a full cache gives up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CachePolicy {
    /// Least recently used.
    #[default]
    Lru,
    /// Least frequently used over the whole run (ties: least recently used).
    Lfu,
}

impl std::str::FromStr for CachePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lru" => Ok(CachePolicy::Lru),
            "lfu" => Ok(CachePolicy::Lfu),
            _ => Err(format!("unknown cache policy {s:?}: expected lru or lfu")),
        }
    }
}

pub struct SlotCache<V> {
    capacity: usize,
    policy: CachePolicy,
    entries: HashMap<usize, (V, u64)>,
    /// Uses of every expert since start (LFU).
    uses: Vec<u64>,
    clock: u64,
}

impl<V> SlotCache<V> {
    pub fn new(capacity: usize, experts: usize, policy: CachePolicy) -> Self {
        SlotCache {
            capacity: capacity.max(1),
            policy,
            entries: HashMap::new(),
            uses: vec![0; experts],
            clock: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn touch(&mut self, expert: usize) -> u64 {
        self.clock += 1;
        self.uses[expert] += 1;
        self.clock
    }

    /// The cached value of `expert`, counting a use.
    pub fn get(&mut self, expert: usize) -> Option<&V> {
        if !self.entries.contains_key(&expert) {
            return None;
        }
        let now = self.touch(expert);
        let entry = self.entries.get_mut(&expert).expect("checked above");
        entry.1 = now;
        Some(&entry.0)
    }

    /// Drops `expert`'s entry (a failed read, to be tried again).
    pub fn remove(&mut self, expert: usize) -> Option<V> {
        self.entries.remove(&expert).map(|(value, _)| value)
    }

    /// Adds `expert`; when the cache is full, evicts one entry not in `pinned` and returns it.
    /// (When every entry is pinned the cache grows past its capacity for the moment.)
    pub fn insert(&mut self, expert: usize, value: V, pinned: &[usize]) -> Option<V> {
        let mut evicted = None;
        if self.entries.len() >= self.capacity {
            let victim = self
                .entries
                .iter()
                .filter(|(e, _)| !pinned.contains(e))
                .min_by_key(|(&e, &(_, last))| match self.policy {
                    CachePolicy::Lru => (0, last),
                    CachePolicy::Lfu => (self.uses[e], last),
                })
                .map(|(&e, _)| e);
            if let Some(v) = victim {
                evicted = self.entries.remove(&v).map(|(value, _)| value);
            }
        }
        let now = self.touch(expert);
        self.entries.insert(expert, (value, now));
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_the_least_recently_used_unpinned_entry() {
        let mut c = SlotCache::new(2, 8, CachePolicy::Lru);
        assert!(c.insert(1, "a", &[]).is_none());
        assert!(c.insert(2, "b", &[]).is_none());
        assert!(c.get(1).is_some());
        assert_eq!(c.insert(3, "c", &[]), Some("b"));
        // 1 is older than 3, but pinned: 3 goes.
        assert_eq!(c.insert(4, "d", &[1]), Some("c"));
        assert!(c.get(2).is_none() && c.get(3).is_none());
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn lfu_keeps_the_frequent_expert() {
        let mut c = SlotCache::new(2, 8, CachePolicy::Lfu);
        c.insert(1, (), &[]);
        for _ in 0..3 {
            c.get(1);
        }
        c.insert(2, (), &[]);
        c.insert(3, (), &[]); // evicts 2 (1 use) rather than 1 (4 uses)
        assert!(c.get(1).is_some());
        assert!(c.get(2).is_none());
    }

    #[test]
    fn all_pinned_grows_past_capacity() {
        let mut c = SlotCache::new(1, 4, CachePolicy::Lru);
        c.insert(0, (), &[]);
        assert!(c.insert(1, (), &[0, 1]).is_none());
        assert_eq!(c.len(), 2);
    }
}
