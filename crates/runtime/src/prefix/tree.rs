//! The radix tree over token ids that holds the cached prefixes.

use std::collections::HashMap;

use super::snapshot::{PrefixKv, PrefixState};

/// A node: the edge of tokens `[start, end)` from its parent, their KV rows, and (when it is a
/// snapshot) the state at `end`.
struct Node {
    parent: usize,
    /// The edge's tokens (empty for the root).
    tokens: Vec<u32>,
    start: usize,
    /// The KV rows of `tokens` (`None` for the root).
    kv: Option<PrefixKv>,
    state: Option<PrefixState>,
    /// By the first token of the child's edge.
    children: HashMap<u32, usize>,
    last_used: u64,
}

impl Node {
    fn end(&self) -> usize {
        self.start + self.tokens.len()
    }

    fn bytes(&self) -> u64 {
        self.kv.as_ref().map_or(0, PrefixKv::bytes)
            + self.state.as_ref().map_or(0, PrefixState::bytes)
    }
}

const ROOT: usize = 0;

/// The longest cached prefix of a prompt that ends on a snapshot: the KV rows along the path
/// from the root, in order, and the state at its end.
pub struct CachedPrefix<'a> {
    pub tokens: usize,
    pub segments: Vec<&'a PrefixKv>,
    pub state: &'a PrefixState,
}

/// The prefixes of the sequences run so far, within `capacity` bytes. Entries are evicted
/// least recently used first: a snapshot that has children loses only its state (its KV rows
/// still serve the longer prefixes below it), a leaf loses everything. A restored sequence
/// holds its own reference to every KV block it restored (CPU) or its own copy of the rows
/// (CUDA), so eviction never frees what a running sequence uses: a block returns to the pool
/// only when its last reference goes.
pub struct PrefixCache {
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
    bytes: u64,
    capacity: u64,
    clock: u64,
    evictions: u64,
}

impl PrefixCache {
    pub fn new(capacity: u64) -> Self {
        let root = Node {
            parent: ROOT,
            tokens: Vec::new(),
            start: 0,
            kv: None,
            state: None,
            children: HashMap::new(),
            last_used: 0,
        };
        Self {
            nodes: vec![Some(root)],
            free: Vec::new(),
            bytes: 0,
            capacity,
            clock: 0,
            evictions: 0,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Snapshots held.
    pub fn entries(&self) -> u64 {
        self.nodes
            .iter()
            .flatten()
            .filter(|n| n.state.is_some())
            .count() as u64
    }

    /// Entries evicted since the cache was made.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    fn node(&self, id: usize) -> &Node {
        self.nodes[id].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, id: usize) -> &mut Node {
        self.nodes[id].as_mut().expect("a live node")
    }

    /// The nodes whose whole edge `tokens` starts with, from the root down, and how many
    /// tokens match in all (the last part may run into the middle of a further edge).
    fn walk(&self, tokens: &[u32]) -> (Vec<usize>, usize) {
        let mut path = vec![ROOT];
        let mut pos = 0;
        loop {
            let node = self.node(*path.last().expect("the root"));
            let Some(&child) = tokens.get(pos).and_then(|t| node.children.get(t)) else {
                return (path, pos);
            };
            let edge = &self.node(child).tokens;
            let common = edge
                .iter()
                .zip(&tokens[pos..])
                .take_while(|(a, b)| a == b)
                .count();
            pos += common;
            if common < edge.len() {
                return (path, pos);
            }
            path.push(child);
        }
    }

    /// The longest cached prefix of `tokens` no longer than `limit` tokens that ends on a
    /// snapshot, marked as used now.
    pub fn lookup(&mut self, tokens: &[u32], limit: usize) -> Option<CachedPrefix<'_>> {
        let (path, _) = self.walk(&tokens[..limit.min(tokens.len())]);
        let depth = path.iter().rposition(|&id| self.node(id).state.is_some())?;
        self.clock += 1;
        for &id in &path[..=depth] {
            let clock = self.clock;
            self.node_mut(id).last_used = clock;
        }
        let end = self.node(path[depth]);
        Some(CachedPrefix {
            tokens: end.end(),
            segments: path[1..=depth]
                .iter()
                .map(|&id| self.node(id).kv.as_ref().expect("a non-root node has KV"))
                .collect(),
            state: end.state.as_ref().expect("a snapshot"),
        })
    }

    /// Where the KV rows to capture for a snapshot of `tokens` start (the cache holds the
    /// rows before it), or `None` when that snapshot is already cached.
    pub fn missing_from(&self, tokens: &[u32]) -> Option<usize> {
        let (path, matched) = self.walk(tokens);
        let last = self.node(*path.last().expect("the root"));
        if matched == tokens.len() && last.end() == tokens.len() && last.state.is_some() {
            return None;
        }
        Some(matched)
    }

    /// Adds the snapshot of `tokens`: `kv` holds their KV rows from
    /// [`PrefixCache::missing_from`]'s position on, `state` the state after them. Then evicts
    /// down to the capacity.
    pub fn insert(&mut self, tokens: &[u32], kv: PrefixKv, state: PrefixState) {
        assert_eq!(kv.end(), tokens.len(), "KV rows end where the tokens do");
        assert_eq!(
            state.position(),
            tokens.len(),
            "the state is at the tokens' end"
        );
        self.clock += 1;
        let clock = self.clock;
        let mut node = ROOT;
        let mut pos = 0;
        while pos < tokens.len() {
            let Some(&child) = self.node(node).children.get(&tokens[pos]) else {
                assert!(
                    kv.start() <= pos,
                    "KV rows from {} missing before {pos}",
                    kv.start()
                );
                let rows = if kv.start() == pos {
                    kv
                } else {
                    kv.split_at(pos).1
                };
                let leaf = self.add(Node {
                    parent: node,
                    tokens: tokens[pos..].to_vec(),
                    start: pos,
                    kv: Some(rows),
                    state: None,
                    children: HashMap::new(),
                    last_used: clock,
                });
                self.node_mut(node).children.insert(tokens[pos], leaf);
                node = leaf;
                break;
            };
            let edge = &self.node(child).tokens;
            let common = edge
                .iter()
                .zip(&tokens[pos..])
                .take_while(|(a, b)| a == b)
                .count();
            if common < edge.len() {
                self.split(child, pos + common);
            }
            node = self.node(node).children[&tokens[pos]];
            pos += common;
        }
        self.node_mut(node).last_used = clock;
        if self.node(node).state.is_none() {
            self.bytes += state.bytes();
            self.node_mut(node).state = Some(state);
        }
        self.evict_to(self.capacity);
    }

    fn add(&mut self, node: Node) -> usize {
        self.bytes += node.bytes();
        match self.free.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    /// Cuts `id`'s edge at position `at`: a new node without state takes the edge's first
    /// part and becomes `id`'s parent.
    fn split(&mut self, id: usize, at: usize) {
        let n = self.node(id);
        let cut = at - n.start;
        let old_kv = n.kv.as_ref().expect("a non-root node has KV");
        let (head_kv, tail_kv) = old_kv.split_at(at);
        let (old_bytes, tail_bytes) = (old_kv.bytes(), tail_kv.bytes());
        let head = Node {
            parent: n.parent,
            tokens: n.tokens[..cut].to_vec(),
            start: n.start,
            kv: Some(head_kv),
            state: None,
            children: HashMap::from([(n.tokens[cut], id)]),
            last_used: n.last_used,
        };
        let (parent, first, tail_tokens) = (n.parent, n.tokens[0], n.tokens[cut..].to_vec());
        // `add` counts the head's rows; the tail's replace the old rows.
        let middle = self.add(head);
        self.bytes = self.bytes + tail_bytes - old_bytes;
        let node = self.node_mut(id);
        node.parent = middle;
        node.tokens = tail_tokens;
        node.start = at;
        node.kv = Some(tail_kv);
        self.node_mut(parent).children.insert(first, middle);
    }

    /// Evicts least recently used entries until the cache holds at most `limit` bytes.
    pub fn evict_to(&mut self, limit: u64) {
        while self.bytes > limit && self.evict_one() {}
    }

    /// Evicts the least recently used entry (a leaf with its KV rows, or the state of a
    /// snapshot that has children); false when the cache holds nothing. The CPU scheduler calls
    /// it when the KV pool runs short: the blocks an entry alone referenced go back to the pool.
    pub fn evict_one(&mut self) -> bool {
        let victim = self
            .nodes
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(id, n)| n.as_ref().map(|n| (id, n)))
            .filter(|(_, n)| n.children.is_empty() || n.state.is_some())
            .min_by_key(|(_, n)| n.last_used)
            .map(|(id, _)| id);
        let Some(id) = victim else {
            return false;
        };
        self.evictions += 1;
        if self.node(id).children.is_empty() {
            self.remove_leaf(id);
        } else {
            let state = self.node_mut(id).state.take().expect("a snapshot");
            self.bytes -= state.bytes();
        }
        true
    }

    /// Removes leaf `id`, then its ancestors that are left as leaves without a snapshot (their
    /// rows could never be resumed from).
    fn remove_leaf(&mut self, mut id: usize) {
        loop {
            let node = self.nodes[id].take().expect("a live node");
            self.free.push(id);
            self.bytes -= node.bytes();
            let parent = self.node_mut(node.parent);
            parent.children.remove(&node.tokens[0]);
            let prune = node.parent != ROOT && parent.children.is_empty() && parent.state.is_none();
            if !prune {
                return;
            }
            id = node.parent;
        }
    }
}

#[cfg(test)]
mod tests {
    use spindle_cpu::session::{BoundaryState, GdnState, KvRows, KvSegment};

    use super::*;

    /// KV rows whose values are their positions (one float per token per array), so a
    /// restored prefix shows which rows it holds; a state of `state_floats` floats.
    fn piece(tokens: &[u32], from: usize, state_floats: usize) -> (PrefixKv, PrefixState) {
        let rows: Vec<f32> = (from..tokens.len()).map(|p| p as f32).collect();
        let kv = KvSegment {
            start: from,
            end: tokens.len(),
            layers: vec![
                None,
                Some(KvRows {
                    keys: rows.clone(),
                    values: rows,
                    indexer_keys: Vec::new(),
                }),
            ],
        };
        let state = BoundaryState {
            position: tokens.len(),
            layers: vec![
                Some(GdnState {
                    conv: Vec::new(),
                    recurrent: vec![tokens.len() as f32; state_floats],
                }),
                None,
            ],
            ple: None,
        };
        (PrefixKv::Host(kv), PrefixState::Host(state))
    }

    /// Every invariant of the tree: the byte count is the sum of the nodes', children are
    /// keyed by their first token and point back, edges are contiguous, and no leaf is left
    /// without a snapshot.
    fn check(cache: &PrefixCache) {
        let mut bytes = 0;
        for (id, node) in cache.nodes.iter().enumerate() {
            let Some(node) = node else { continue };
            bytes += node.bytes();
            if id != ROOT {
                assert!(
                    node.state.is_some() || !node.children.is_empty(),
                    "bare leaf {id}"
                );
                let kv = node.kv.as_ref().unwrap();
                assert_eq!((kv.start(), kv.end()), (node.start, node.end()));
            }
            for (&first, &child) in &node.children {
                let child = cache.node(child);
                assert_eq!(child.tokens[0], first);
                assert_eq!(child.parent, id);
                assert_eq!(child.start, node.end());
            }
        }
        assert_eq!(bytes, cache.bytes, "the byte count drifted");
    }

    fn restored_rows(hit: &CachedPrefix<'_>) -> Vec<f32> {
        hit.segments
            .iter()
            .flat_map(|s| match s {
                PrefixKv::Host(s) => s.layers[1].as_ref().unwrap().keys.clone(),
                other => panic!("host rows were inserted, not {other:?}"),
            })
            .collect()
    }

    #[test]
    fn random_inserts_and_evictions_keep_the_tree_consistent() {
        let mut rng = 12345u64;
        let mut next = |n: u64| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) % n
        };
        let mut cache = PrefixCache::new(6_000);
        let mut evicted = false;
        for _ in 0..300 {
            // Prompts over a 3-token alphabet share prefixes often.
            let len = 1 + next(40) as usize;
            let tokens: Vec<u32> = (0..len).map(|_| next(3) as u32).collect();
            if next(2) == 0 {
                if let Some(hit) = cache.lookup(&tokens, len) {
                    assert!(hit.tokens <= len);
                    let expect: Vec<f32> = (0..hit.tokens).map(|p| p as f32).collect();
                    assert_eq!(restored_rows(&hit), expect, "rows out of order");
                    assert_eq!(hit.state.position(), hit.tokens);
                }
                continue;
            }
            match cache.missing_from(&tokens) {
                None => {
                    let hit = cache.lookup(&tokens, len).unwrap();
                    assert_eq!(hit.tokens, len, "missing_from said it was cached");
                }
                Some(from) => {
                    let (kv, state) = piece(&tokens, from, 50);
                    cache.insert(&tokens, kv, state);
                }
            }
            evicted |= cache.evictions() > 0;
            assert!(cache.bytes() <= 6_000);
            check(&cache);
        }
        assert!(evicted, "the capacity never bound");
        cache.evict_to(0);
        check(&cache);
        assert_eq!((cache.bytes(), cache.entries()), (0, 0));
        assert!(
            cache.nodes.iter().flatten().count() == 1,
            "only the root is left"
        );
    }
}
