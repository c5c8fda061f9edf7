//! KV cache block management, apart from any kernel (the policy half of vLLM's PagedAttention,
//! Kwon et al., SOSP 2023): a pool of fixed-size blocks with reference counts, a block table
//! per sequence, prefix sharing by hashing full blocks (the hash of a block chains the hash of
//! the blocks before it, so a shared system prompt is stored once), copy-on-write when a
//! sequence writes into a block it shares (after `fork`), and accounting of used, free and
//! internally fragmented slots. `ContiguousAllocator` is the baseline it replaces: every
//! request reserves its maximum length in one contiguous range (first fit).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// A physical block.
pub type BlockId = u32;

/// Why an allocation did not happen (nothing was changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfBlocks {
    pub needed: usize,
    pub free: usize,
}

impl std::fmt::Display for OutOfBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "needs {} blocks, {} free", self.needed, self.free)
    }
}

/// One sequence's blocks and the tokens stored (or being stored) in them.
#[derive(Debug, Clone, Default)]
pub struct SeqBlocks {
    pub table: Vec<BlockId>,
    pub tokens: Vec<u32>,
    /// Leading full blocks already registered for sharing.
    hashed: usize,
}

/// Occupancy of the pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvStats {
    pub blocks_total: usize,
    pub blocks_used: usize,
    /// Token slots in used blocks (blocks_used × block_size).
    pub slots_allocated: usize,
    /// Slots that hold a token (a shared block counts once).
    pub slots_filled: usize,
    /// Tokens of all sequences (a shared block counts once per sequence).
    pub logical_tokens: usize,
}

impl KvStats {
    /// Allocated slots holding no token (the tails of last blocks), in %.
    pub fn fragmentation_pct(&self) -> f64 {
        pct(
            self.slots_allocated - self.slots_filled,
            self.slots_allocated,
        )
    }
    /// Slots of the whole pool that hold a token, in %.
    pub fn utilisation_pct(&self, block_size: usize) -> f64 {
        pct(self.slots_filled, self.blocks_total * block_size)
    }
}

fn pct(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

/// The block pool and every sequence's table.
#[derive(Debug, Clone)]
pub struct BlockManager {
    pub block_size: usize,
    pub prefix_sharing: bool,
    refs: Vec<u32>,
    /// Tokens written into each block.
    fill: Vec<usize>,
    /// Free blocks; popped from the end (lowest id first).
    free: Vec<BlockId>,
    by_hash: HashMap<u64, BlockId>,
    hash_of: Vec<Option<u64>>,
    seqs: HashMap<u64, SeqBlocks>,
}

fn chain_hash(prev: u64, tokens: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    prev.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockManager {
    /// `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize, prefix_sharing: bool) -> BlockManager {
        assert!(block_size > 0, "block size must be > 0");
        BlockManager {
            block_size,
            prefix_sharing,
            refs: vec![0; num_blocks],
            fill: vec![0; num_blocks],
            free: (0..num_blocks as BlockId).rev().collect(),
            by_hash: HashMap::new(),
            hash_of: vec![None; num_blocks],
            seqs: HashMap::new(),
        }
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    pub fn total_blocks(&self) -> usize {
        self.refs.len()
    }

    /// The blocks and tokens of `seq`.
    pub fn seq(&self, seq: u64) -> Option<&SeqBlocks> {
        self.seqs.get(&seq)
    }

    /// Reference count of a block (tests, accounting).
    pub fn refs(&self, block: BlockId) -> u32 {
        self.refs[block as usize]
    }

    /// Leading full blocks of `prompt` already stored (never the whole prompt: its last token
    /// must run to produce logits).
    fn shared_prefix(&self, prompt: &[u32]) -> Vec<BlockId> {
        if !self.prefix_sharing {
            return vec![];
        }
        let bs = self.block_size;
        let mut out = vec![];
        let mut h = 0;
        for chunk in prompt[..prompt.len().saturating_sub(1)].chunks_exact(bs) {
            h = chain_hash(h, chunk);
            match self.by_hash.get(&h) {
                Some(&b) => out.push(b),
                None => break,
            }
        }
        out
    }

    /// Blocks `allocate` would take from the free list for `prompt`.
    pub fn blocks_needed(&self, prompt: &[u32]) -> usize {
        self.prompt_blocks(prompt.len()) - self.shared_prefix(prompt).len()
    }

    fn prompt_blocks(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    fn take(&mut self) -> BlockId {
        let b = self.free.pop().expect("checked before");
        if let Some(h) = self.hash_of[b as usize].take() {
            self.by_hash.remove(&h);
        }
        self.refs[b as usize] = 1;
        self.fill[b as usize] = 0;
        b
    }

    /// Gives `seq` blocks for `prompt`, sharing its leading full blocks with sequences that
    /// stored the same tokens; returns how many prompt tokens are already in the cache.
    pub fn allocate(&mut self, seq: u64, prompt: &[u32]) -> Result<usize, OutOfBlocks> {
        assert!(!self.seqs.contains_key(&seq), "sequence {seq} exists");
        let shared = self.shared_prefix(prompt);
        let needed = self.prompt_blocks(prompt.len()) - shared.len();
        if needed > self.free.len() {
            return Err(OutOfBlocks {
                needed,
                free: self.free.len(),
            });
        }
        for &b in &shared {
            self.refs[b as usize] += 1;
        }
        let mut table = shared.clone();
        for _ in 0..needed {
            table.push(self.take());
        }
        let cached = shared.len() * self.block_size;
        for (i, &b) in table.iter().enumerate() {
            let upto = ((i + 1) * self.block_size).min(prompt.len());
            self.fill[b as usize] = self.fill[b as usize].max(upto - i * self.block_size);
        }
        self.seqs.insert(
            seq,
            SeqBlocks {
                table,
                tokens: prompt.to_vec(),
                hashed: shared.len(),
            },
        );
        Ok(cached)
    }

    /// Makes room for `tokens` after the tokens of `seq`: new blocks when the last is full,
    /// and a private copy of the last block when it is shared (copy-on-write). Returns the
    /// (source, destination) block copies the caller must make in the KV pools first.
    pub fn append(
        &mut self,
        seq: u64,
        tokens: &[u32],
    ) -> Result<Vec<(BlockId, BlockId)>, OutOfBlocks> {
        let bs = self.block_size;
        let s = &self.seqs[&seq];
        let len = s.tokens.len();
        let new_blocks = (len + tokens.len()).div_ceil(bs) - s.table.len();
        let cow = !len.is_multiple_of(bs)
            && !tokens.is_empty()
            && self.refs[*s.table.last().expect("a partial block") as usize] > 1;
        let needed = new_blocks + cow as usize;
        if needed > self.free.len() {
            return Err(OutOfBlocks {
                needed,
                free: self.free.len(),
            });
        }
        let mut copies = vec![];
        if cow {
            let last = *self.seqs[&seq].table.last().expect("partial block");
            let fresh = self.take();
            self.refs[last as usize] -= 1;
            self.fill[fresh as usize] = len % bs;
            copies.push((last, fresh));
            *self.seqs.get_mut(&seq).unwrap().table.last_mut().unwrap() = fresh;
        }
        for _ in 0..new_blocks {
            let b = self.take();
            self.seqs.get_mut(&seq).unwrap().table.push(b);
        }
        let s = self.seqs.get_mut(&seq).unwrap();
        s.tokens.extend_from_slice(tokens);
        let n = s.tokens.len();
        for (i, &b) in s.table.iter().enumerate().skip(len / bs) {
            let f = ((i + 1) * bs).min(n) - i * bs;
            self.fill[b as usize] = self.fill[b as usize].max(f);
        }
        Ok(copies)
    }

    /// Registers the full blocks among the first `computed` tokens of `seq` for sharing (call
    /// once their K/V are written).
    pub fn mark_computed(&mut self, seq: u64, computed: usize) {
        if !self.prefix_sharing {
            return;
        }
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).expect("a live sequence");
        let full = computed.min(s.tokens.len()) / bs;
        let mut h = 0;
        for i in 0..full {
            h = chain_hash(h, &s.tokens[i * bs..(i + 1) * bs]);
            if i < s.hashed {
                continue;
            }
            let b = s.table[i];
            if self.hash_of[b as usize].is_none() && !self.by_hash.contains_key(&h) {
                self.by_hash.insert(h, b);
                self.hash_of[b as usize] = Some(h);
            }
        }
        s.hashed = s.hashed.max(full);
    }

    /// `child` shares every block of `parent` (parallel sampling, beam search, draft
    /// branches); the first write into the shared last block copies it.
    pub fn fork(&mut self, parent: u64, child: u64) {
        let s = self.seqs[&parent].clone();
        for &b in &s.table {
            self.refs[b as usize] += 1;
        }
        self.seqs.insert(child, s);
    }

    /// Drops the last `n` tokens of `seq` (rejected draft tokens), freeing emptied blocks.
    pub fn truncate(&mut self, seq: u64, keep: usize) {
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).expect("a live sequence");
        s.tokens.truncate(keep);
        s.hashed = s.hashed.min(keep / bs);
        let dropped: Vec<BlockId> = s.table.drain(keep.div_ceil(bs)..).collect();
        // A private last block now holds only the kept tokens.
        if let Some(&last) = s.table.last() {
            if self.refs[last as usize] == 1 {
                self.fill[last as usize] = keep - (s.table.len() - 1) * bs;
            }
        }
        for b in dropped {
            self.release(b);
        }
    }

    fn release(&mut self, b: BlockId) {
        let r = &mut self.refs[b as usize];
        *r -= 1;
        if *r == 0 {
            if let Some(h) = self.hash_of[b as usize].take() {
                self.by_hash.remove(&h);
            }
            self.fill[b as usize] = 0;
            self.free.push(b);
        }
    }

    /// Releases every block of `seq`.
    pub fn free(&mut self, seq: u64) {
        if let Some(s) = self.seqs.remove(&seq) {
            for b in s.table {
                self.release(b);
            }
        }
    }

    /// Occupancy now.
    pub fn stats(&self) -> KvStats {
        let used = self.refs.iter().filter(|&&r| r > 0).count();
        KvStats {
            blocks_total: self.refs.len(),
            blocks_used: used,
            slots_allocated: used * self.block_size,
            slots_filled: self
                .refs
                .iter()
                .zip(&self.fill)
                .filter(|(r, _)| **r > 0)
                .map(|(_, f)| f)
                .sum(),
            logical_tokens: self.seqs.values().map(|s| s.tokens.len()).sum(),
        }
    }
}

/// The baseline: each request reserves `max_len` contiguous slots (first fit) for its life.
#[derive(Debug, Clone)]
pub struct ContiguousAllocator {
    pub capacity: usize,
    /// Free ranges: start → length, coalesced.
    free: BTreeMap<usize, usize>,
    /// Per request: (start, reserved, used).
    live: HashMap<u64, (usize, usize, usize)>,
}

impl ContiguousAllocator {
    pub fn new(capacity: usize) -> ContiguousAllocator {
        ContiguousAllocator {
            capacity,
            free: BTreeMap::from([(0, capacity)]),
            live: HashMap::new(),
        }
    }

    /// Reserves `max_len` slots for `seq` holding `used` tokens; false when no free range is
    /// long enough.
    pub fn reserve(&mut self, seq: u64, max_len: usize, used: usize) -> bool {
        let Some((&start, &len)) = self.free.iter().find(|(_, &l)| l >= max_len) else {
            return false;
        };
        self.free.remove(&start);
        if len > max_len {
            self.free.insert(start + max_len, len - max_len);
        }
        self.live.insert(seq, (start, max_len, used));
        true
    }

    /// Records one more token of `seq` (within its reservation).
    pub fn grow(&mut self, seq: u64) {
        let e = self.live.get_mut(&seq).expect("a live request");
        e.2 = (e.2 + 1).min(e.1);
    }

    /// Returns the range of `seq`, merging it with free neighbours.
    pub fn release(&mut self, seq: u64) {
        let Some((mut start, mut len, _)) = self.live.remove(&seq) else {
            return;
        };
        if let Some((&s, &l)) = self.free.range(..start).next_back() {
            if s + l == start {
                self.free.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(&l) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += l;
        }
        self.free.insert(start, len);
    }

    /// (reserved, used) slots over live requests.
    pub fn usage(&self) -> (usize, usize) {
        self.live
            .values()
            .fold((0, 0), |(r, u), e| (r + e.1, u + e.2))
    }

    /// Free slots outside the largest free range (external fragmentation).
    pub fn stranded(&self) -> usize {
        let total: usize = self.free.values().sum();
        total - self.free.values().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_blocks_are_shared_and_freed_once() {
        let mut m = BlockManager::new(16, 4, true);
        let system: Vec<u32> = (100..110).collect(); // 2 full blocks + 2 tokens
        let a: Vec<u32> = system.iter().copied().chain([1, 2, 3]).collect();
        let b: Vec<u32> = system.iter().copied().chain([7, 8]).collect();
        assert_eq!(m.allocate(1, &a).unwrap(), 0);
        m.mark_computed(1, a.len());
        let before = m.free_blocks();
        assert_eq!(m.blocks_needed(&b), 1);
        assert_eq!(m.allocate(2, &b).unwrap(), 8, "two full blocks are cached");
        assert_eq!(before - m.free_blocks(), 1);
        let (ta, tb) = (
            m.seq(1).unwrap().table.clone(),
            m.seq(2).unwrap().table.clone(),
        );
        assert_eq!(ta[..2], tb[..2]);
        assert_ne!(ta[2], tb[2]);
        assert_eq!(m.refs(ta[0]), 2);
        let st = m.stats();
        assert_eq!(st.logical_tokens, 25);
        assert_eq!(st.slots_filled, 8 + 4 + 1 + 4);
        m.free(1);
        assert_eq!(m.refs(ta[0]), 1);
        m.free(2);
        assert_eq!(m.free_blocks(), 16);
        assert_eq!(m.stats().blocks_used, 0);
        // Without sharing, nothing is cached.
        let mut m = BlockManager::new(16, 4, false);
        m.allocate(1, &a).unwrap();
        m.mark_computed(1, a.len());
        assert_eq!(m.allocate(2, &b).unwrap(), 0);
    }

    #[test]
    fn fork_copies_on_write_and_runs_out_cleanly() {
        let mut m = BlockManager::new(4, 4, false);
        m.allocate(1, &[1, 2, 3, 4, 5, 6]).unwrap();
        m.fork(1, 2);
        let t = m.seq(1).unwrap().table.clone();
        assert_eq!(m.refs(t[1]), 2);
        let copies = m.append(2, &[9]).unwrap();
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].0, t[1]);
        assert_eq!(m.refs(t[1]), 1);
        assert_eq!(m.refs(t[0]), 2, "full blocks stay shared");
        // The parent writes into its own (now private) block: no copy.
        assert!(m.append(1, &[7]).unwrap().is_empty());
        // 3 blocks used, 1 free: 2 blocks more fail without changing anything.
        let before = m.stats();
        let e = m.append(1, &[0; 6]).unwrap_err();
        assert_eq!(e, OutOfBlocks { needed: 2, free: 1 });
        assert_eq!(m.stats(), before);
        m.truncate(2, 4);
        assert_eq!(m.seq(2).unwrap().table.len(), 1);
        m.free(1);
        m.free(2);
        assert_eq!(m.free_blocks(), 4);
    }

    #[test]
    fn contiguous_first_fit_coalesces() {
        let mut c = ContiguousAllocator::new(100);
        assert!(c.reserve(1, 40, 10));
        assert!(c.reserve(2, 40, 10));
        assert!(!c.reserve(3, 40, 1), "20 free slots left");
        c.release(1);
        assert_eq!(c.stranded(), 20, "40 free at the front, 20 at the back");
        assert!(c.reserve(3, 30, 1));
        c.grow(3);
        assert_eq!(c.usage(), (70, 12));
        c.release(2);
        c.release(3);
        assert_eq!(c.stranded(), 0);
        assert!(c.reserve(4, 100, 0));
    }
}
