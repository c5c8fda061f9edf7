//! Draft trees. Node 0 is the root: the last token the target has produced, whose K/V are not
//! in the cache yet; every other node is a draft token whose parent comes before it (so the
//! node order is topological and a path's indices increase). From the parent list alone come
//! the depth of each node, the attention mask (a node sees the committed context, its
//! ancestors and itself) and the position ids (context length + depth). Shapes: a chain of k
//! tokens; a static tree given as branching per depth (`[3, 2, 1]`: 3 children of the root,
//! 2 of each of those, 1 of each of those — Medusa/SpecInfer style); a dynamic tree grown by
//! draft probability under a node budget (EAGLE-2), built by the driver with `push`.

use kernel_common::{error::Result, KernelError};

/// A tree of draft tokens (token ids live beside it, one per node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftTree {
    parent: Vec<Option<usize>>,
    depth: Vec<usize>,
}

impl Default for DraftTree {
    fn default() -> Self {
        Self::root()
    }
}

impl DraftTree {
    /// The root alone.
    pub fn root() -> DraftTree {
        DraftTree {
            parent: vec![None],
            depth: vec![0],
        }
    }

    /// A tree from a parent list: entry 0 is None, every other entry an earlier node.
    pub fn from_parents(parents: &[Option<usize>]) -> Result<DraftTree> {
        let bad = |m: String| Err(KernelError::InvalidShape(m));
        if parents.first() != Some(&None) {
            return bad("node 0 must be the root (no parent)".into());
        }
        let mut t = DraftTree::root();
        for (i, p) in parents.iter().enumerate().skip(1) {
            match p {
                Some(p) if *p < i => {
                    t.push(*p);
                }
                _ => {
                    return bad(format!(
                        "node {i} needs a parent among nodes 0..{i}, got {p:?}"
                    ))
                }
            }
        }
        Ok(t)
    }

    /// Adds a child of `parent`; returns its index.
    pub fn push(&mut self, parent: usize) -> usize {
        assert!(
            parent < self.len(),
            "parent {parent} of a tree of {}",
            self.len()
        );
        self.parent.push(Some(parent));
        self.depth.push(self.depth[parent] + 1);
        self.len() - 1
    }

    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// Never: a tree has its root.
    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn parent(&self, i: usize) -> Option<usize> {
        self.parent[i]
    }

    pub fn depth(&self, i: usize) -> usize {
        self.depth[i]
    }

    /// Deepest node's depth.
    pub fn height(&self) -> usize {
        self.depth.iter().copied().max().unwrap_or(0)
    }

    /// Children of `i`, in index order.
    pub fn children(&self, i: usize) -> Vec<usize> {
        (i + 1..self.len())
            .filter(|&c| self.parent[c] == Some(i))
            .collect()
    }

    /// Nodes from the root to `i`, inclusive.
    pub fn path_to(&self, i: usize) -> Vec<usize> {
        let mut p = vec![i];
        let mut at = i;
        while let Some(q) = self.parent[at] {
            p.push(q);
            at = q;
        }
        p.reverse();
        p
    }

    /// Nodes without children.
    pub fn leaves(&self) -> Vec<usize> {
        let mut has_child = vec![false; self.len()];
        for p in self.parent.iter().flatten() {
            has_child[*p] = true;
        }
        (0..self.len()).filter(|&i| !has_child[i]).collect()
    }

    /// Row-major n × n: `mask[i·n + j]` = node j is node i or one of its ancestors.
    pub fn mask(&self) -> Vec<bool> {
        let n = self.len();
        let mut m = vec![false; n * n];
        for i in 0..n {
            m[i * n + i] = true;
            if let Some(p) = self.parent[i] {
                // The parent's row is complete: its index is smaller.
                for j in 0..p + 1 {
                    m[i * n + j] = m[i * n + j] || m[p * n + j];
                }
            }
        }
        m
    }

    /// Position ids: context length + depth.
    pub fn positions(&self, context: usize) -> Vec<usize> {
        self.depth.iter().map(|d| context + d).collect()
    }

    /// A chain of `k` draft tokens.
    pub fn chain(k: usize) -> DraftTree {
        let mut t = DraftTree::root();
        for i in 0..k {
            t.push(i);
        }
        t
    }

    /// A static tree: each node at depth d gets `branching[d]` children.
    pub fn static_shape(branching: &[usize]) -> Result<DraftTree> {
        if let Some(b) = branching.iter().find(|&&b| b == 0) {
            return Err(KernelError::InvalidShape(format!(
                "static tree branching must be ≥ 1 at every depth, got {b} in {branching:?}"
            )));
        }
        let mut t = DraftTree::root();
        let mut level = vec![0];
        for &b in branching {
            let mut next = vec![];
            for &p in &level {
                for _ in 0..b {
                    next.push(t.push(p));
                }
            }
            level = next;
        }
        Ok(t)
    }
}

/// The most draft nodes a tree shape may hold: its tree mask is nodes² entries and every
/// node is one query of the target's pass, so a larger tree is a typo, not a draft.
pub const MAX_TREE_NODES: usize = 4096;

/// How the driver shapes its drafts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeShape {
    /// k tokens in a row.
    Chain(usize),
    /// Branching per depth.
    Static(Vec<usize>),
    /// Up to `budget` draft nodes, grown where the draft's path probability is highest.
    Dynamic(usize),
}

impl TreeShape {
    /// `chain:4`, `static:3,2,1` (or `static:3/2/1`), `dynamic:16`.
    pub fn parse(text: &str) -> Result<TreeShape> {
        let bad = || {
            KernelError::Unsupported(format!(
                "tree shape '{text}' is not chain:K, static:B1,B2,... or dynamic:N with positive integers"
            ))
        };
        let (kind, rest) = text.split_once(':').ok_or_else(bad)?;
        // '/' as well as ',': `harness exp --set` splits its values at commas.
        let nums: Vec<usize> = rest
            .split([',', '/'])
            .map(|v| v.trim().parse::<usize>().ok().filter(|&n| n > 0))
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        let shape = match (kind, &nums[..]) {
            ("chain", [k]) => TreeShape::Chain(*k),
            ("static", b) if !b.is_empty() => TreeShape::Static(b.to_vec()),
            ("dynamic", [n]) => TreeShape::Dynamic(*n),
            _ => return Err(bad()),
        };
        match shape.nodes() {
            Some(n) if n <= MAX_TREE_NODES => Ok(shape),
            _ => Err(KernelError::Unsupported(format!(
                "tree shape '{text}' holds more than {MAX_TREE_NODES} draft nodes"
            ))),
        }
    }

    /// Draft nodes of the shape, `None` past `usize` (a static shape's levels multiply).
    fn nodes(&self) -> Option<usize> {
        match self {
            TreeShape::Chain(k) | TreeShape::Dynamic(k) => Some(*k),
            TreeShape::Static(b) => {
                let (mut level, mut total) = (1usize, 0usize);
                for &x in b {
                    level = level.checked_mul(x)?;
                    total = total.checked_add(level)?;
                }
                Some(total)
            }
        }
    }

    /// Draft nodes the shape may hold (without the root); at most `MAX_TREE_NODES` for a
    /// parsed shape.
    pub fn max_nodes(&self) -> usize {
        self.nodes().unwrap_or(usize::MAX)
    }

    /// Depth of the deepest draft node.
    pub fn max_depth(&self) -> usize {
        match self {
            TreeShape::Chain(k) | TreeShape::Dynamic(k) => *k,
            TreeShape::Static(b) => b.len(),
        }
    }

    /// The label, as parsed.
    pub fn label(&self) -> String {
        match self {
            TreeShape::Chain(k) => format!("chain:{k}"),
            TreeShape::Dynamic(n) => format!("dynamic:{n}"),
            TreeShape::Static(b) => format!(
                "static:{}",
                b.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn brute_ancestor(parents: &[Option<usize>], i: usize, j: usize) -> bool {
        let mut at = Some(i);
        while let Some(a) = at {
            if a == j {
                return true;
            }
            at = parents[a];
        }
        false
    }

    proptest! {
        #[test]
        fn mask_and_positions_match_brute_force(raw in proptest::collection::vec(0usize..1000, 0..40), ctx in 0usize..100) {
            let parents: Vec<Option<usize>> = std::iter::once(None)
                .chain(raw.iter().enumerate().map(|(i, r)| Some(r % (i + 1))))
                .collect();
            let t = DraftTree::from_parents(&parents).unwrap();
            let n = t.len();
            let m = t.mask();
            for i in 0..n {
                for j in 0..n {
                    prop_assert_eq!(m[i * n + j], brute_ancestor(&parents, i, j), "({}, {})", i, j);
                }
                let depth = (0..n).filter(|&j| brute_ancestor(&parents, i, j)).count() - 1;
                prop_assert_eq!(t.positions(ctx)[i], ctx + depth);
                prop_assert_eq!(t.path_to(i).len(), depth + 1);
            }
        }
    }

    #[test]
    fn shapes() {
        let t = DraftTree::static_shape(&[3, 2, 1]).unwrap();
        assert_eq!(t.len(), 1 + 3 + 6 + 6);
        assert_eq!(t.children(0).len(), 3);
        assert_eq!(t.leaves().len(), 6);
        assert_eq!(t.height(), 3);
        assert_eq!(TreeShape::parse("static:3,2,1").unwrap().max_nodes(), 15);
        assert_eq!(
            TreeShape::parse("static:3/2/1").unwrap(),
            TreeShape::parse("static:3,2,1").unwrap()
        );
        assert_eq!(DraftTree::chain(4).path_to(4), vec![0, 1, 2, 3, 4]);
        for bad in [
            "static:3,0",
            "chain:0",
            "chain:-1",
            "dynamic:",
            "tree:3",
            "chain:2,2",
            "static",
            "chain:4097",
            "static:64,64,2",
            "static:4294967296,4294967296,4294967296",
        ] {
            assert!(TreeShape::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(TreeShape::parse("chain:4096").unwrap().max_nodes(), 4096);
        assert!(DraftTree::static_shape(&[2, 0]).is_err());
        assert!(DraftTree::from_parents(&[None, Some(1)]).is_err());
        assert!(DraftTree::from_parents(&[Some(0)]).is_err());
    }
}
