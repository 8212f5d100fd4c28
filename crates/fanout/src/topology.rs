//! The static tree: slots numbered in pre-order, so that every subtree is
//! a contiguous range of slots and "does this subtree hold a member?" is a
//! range test on the membership bit-mask (the per-subtree summary that
//! skipping uses, derived from the mask: join and leave stay one atomic
//! operation each).
//!
//! ```text
//!  binary, 7 slots (pre-order)        flat, 5 slots
//!
//!            0                              0
//!          /   \                      / /  \  \
//!         1     4                    1  2   3  4
//!        / \   / \
//!       2   3 5   6                 subtree(1) = [1,4)  subtree(4) = [4,7)
//! ```
//!
//! Three shapes: [`Shape::Flat`] (the root's children are every other
//! slot: Linux's `smp_call_function_many`), [`Shape::Kary`] (a balanced
//! k-ary tree; `Kary(2)` is the binary tree) and [`Shape::Cpu`] (the
//! machine's topology from `/sys`: packages under the root, cores of a
//! package under its first core as a 4-ary tree, hyper-threads under
//! their core).

use crate::error::FanoutError;

/// The most slots a tree (and the model) has: four 64-bit mask words.
pub const SLOTS_MAX: usize = 256;
/// The most slots of a live [`crate::Domain`]: one 64-bit membership word
/// (its top bit marks a multicast in flight), so a join, a leave and a
/// multicast's snapshot are single atomic ops.
pub const SLOTS_MAX_LIVE: usize = 63;
/// The marker of "no parent" (the root).
const NO_PARENT: u16 = u16::MAX;

/// How the slots are arranged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One root with every other slot as its child.
    Flat,
    /// A balanced tree of this fan-out (2 = binary).
    Kary(u16),
    /// The CPU topology read from `/sys/devices/system/cpu`.
    Cpu,
}

impl Shape {
    /// Parse `flat`, `binary`, `kary:K` or `cpu`.
    pub fn parse(s: &str) -> Result<Shape, FanoutError> {
        match s {
            "flat" => Ok(Shape::Flat),
            "binary" => Ok(Shape::Kary(2)),
            "cpu" => Ok(Shape::Cpu),
            other => match other.strip_prefix("kary:").map(str::parse::<u16>) {
                Some(Ok(k)) if k >= 2 => Ok(Shape::Kary(k)),
                _ => Err(FanoutError::BadShape {
                    shape: other.to_string(),
                }),
            },
        }
    }
}

/// A set of slots (up to [`SLOTS_MAX`]): the membership snapshot of a
/// multicast, as the model and the planner see it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotSet {
    words: [u64; SLOTS_MAX / 64],
}

impl SlotSet {
    /// The set of a live domain's membership word.
    pub fn from_word(word: u64) -> SlotSet {
        let mut set = SlotSet::default();
        set.words[0] = word;
        set
    }

    pub fn insert(&mut self, slot: usize) {
        assert!(slot < SLOTS_MAX, "slot {slot} beyond SLOTS_MAX");
        self.words[slot / 64] |= 1 << (slot % 64);
    }

    pub fn remove(&mut self, slot: usize) {
        assert!(slot < SLOTS_MAX, "slot {slot} beyond SLOTS_MAX");
        self.words[slot / 64] &= !(1 << (slot % 64));
    }

    pub fn contains(&self, slot: usize) -> bool {
        slot < SLOTS_MAX && self.words[slot / 64] & (1 << (slot % 64)) != 0
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// Whether any slot of `[start, end)` is in the set: a subtree's
    /// summary, at most four word tests.
    #[inline]
    pub fn any_in(&self, start: usize, end: usize) -> bool {
        debug_assert!(start <= end && end <= SLOTS_MAX, "range [{start},{end}) within the set");
        let mut word = start / 64;
        while word * 64 < end {
            let lo = (word * 64).max(start) - word * 64;
            let hi = ((word + 1) * 64).min(end) - word * 64;
            let bits = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            if self.words[word] & bits != 0 {
                return true;
            }
            word += 1;
        }
        false
    }

    /// The first slot of the set at or after `from` (`None`: none).
    /// Bit scans, a word at a time: a flat send and a skipping scatter
    /// step from one target to the next without testing the slots
    /// between.
    #[inline]
    pub fn next_from(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        if word >= self.words.len() {
            return None;
        }
        let mut bits = self.words[word] & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word == self.words.len() {
                return None;
            }
            bits = self.words[word];
        }
    }

    /// The slots in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let mut next = self.next_from(0);
        std::iter::from_fn(move || {
            let slot = next?;
            next = self.next_from(slot + 1);
            Some(slot)
        })
    }
}

/// The static tree over `slots` slots, in pre-order.
#[derive(Clone, Debug)]
pub struct Tree {
    shape: Shape,
    parent: Vec<u16>,
    children: Vec<Vec<u16>>,
    /// One past the last slot of each slot's subtree.
    subtree_end: Vec<u16>,
    depth: Vec<u16>,
    /// The greatest depth (kept: every acknowledgement's climb is bounded
    /// by it, and scanning `depth` there cost O(slots) per multicast).
    height: u16,
    /// The CPU each slot is meant to run on.
    cpu_of_slot: Vec<u32>,
}

impl Tree {
    /// A tree of `slots` slots in `shape`. `Shape::Cpu` reads the
    /// topology under `/sys/devices/system/cpu`.
    pub fn build(shape: Shape, slots: usize) -> Result<Tree, FanoutError> {
        match shape {
            Shape::Cpu => Tree::from_sysfs(std::path::Path::new("/sys/devices/system/cpu"), slots),
            _ => Tree::from_children(shape, kary_children(shape, slots)?, (0..slots as u32).collect()),
        }
    }

    /// The CPU-topology tree of the first `slots` online CPUs described
    /// under `sysfs` (a directory holding `cpuN/topology/`).
    pub fn from_sysfs(sysfs: &std::path::Path, slots: usize) -> Result<Tree, FanoutError> {
        check_slot_count(slots)?;
        let mut cpus = Vec::new();
        for cpu in 0..4096u32 {
            let dir = sysfs.join(format!("cpu{cpu}/topology"));
            let read =
                |name: &str| -> Option<u32> { std::fs::read_to_string(dir.join(name)).ok()?.trim().parse().ok() };
            let (Some(package), Some(core)) = (read("physical_package_id"), read("core_id")) else {
                if cpus.len() >= slots || cpu > 1024 {
                    break;
                }
                continue;
            };
            cpus.push((package, core, cpu));
            if cpus.len() == slots {
                break;
            }
        }
        if cpus.len() < slots {
            return Err(FanoutError::TopologyTooSmall {
                slots,
                cpus: cpus.len(),
                path: sysfs.display().to_string(),
            });
        }
        Ok(cpu_tree(&cpus))
    }

    fn from_children(shape: Shape, children: Vec<Vec<u16>>, cpu_of_slot: Vec<u32>) -> Result<Tree, FanoutError> {
        let slots = children.len();
        check_slot_count(slots)?;
        let mut parent = vec![NO_PARENT; slots];
        for (p, kids) in children.iter().enumerate() {
            for &c in kids {
                assert_eq!(parent[c as usize], NO_PARENT, "slot {c} has one parent");
                assert!(c as usize > p, "pre-order: a child comes after its parent");
                parent[c as usize] = p as u16;
            }
        }
        let mut subtree_end = vec![0u16; slots];
        let mut depth = vec![0u16; slots];
        for s in (0..slots).rev() {
            subtree_end[s] = children[s]
                .iter()
                .map(|&c| subtree_end[c as usize])
                .max()
                .unwrap_or(s as u16 + 1);
        }
        for s in 1..slots {
            depth[s] = depth[parent[s] as usize] + 1;
        }
        let height = depth.iter().copied().max().unwrap_or(0);
        let tree = Tree {
            shape,
            parent,
            children,
            subtree_end,
            depth,
            height,
            cpu_of_slot,
        };
        tree.check_preorder();
        Ok(tree)
    }

    /// Invariant `subtrees_are_contiguous`: every subtree is the range
    /// `[s, subtree_end[s])` and its children tile it in order.
    fn check_preorder(&self) {
        assert_eq!(self.parent[0], NO_PARENT, "slot 0 is the root");
        for s in 0..self.slots() {
            let mut next = s + 1;
            for &c in &self.children[s] {
                assert_eq!(c as usize, next, "children of {s} tile its subtree in order");
                next = self.subtree_end[c as usize] as usize;
            }
            assert_eq!(next, self.subtree_end[s] as usize, "subtree of {s} is contiguous");
        }
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }
    pub fn slots(&self) -> usize {
        self.parent.len()
    }
    pub fn parent(&self, slot: usize) -> Option<usize> {
        let p = self.parent[slot];
        (p != NO_PARENT).then_some(p as usize)
    }
    pub fn children(&self, slot: usize) -> &[u16] {
        &self.children[slot]
    }
    /// The slots of `slot`'s subtree: `[slot, end)`.
    pub fn subtree_end(&self, slot: usize) -> usize {
        self.subtree_end[slot] as usize
    }
    pub fn depth(&self, slot: usize) -> usize {
        self.depth[slot] as usize
    }
    #[inline]
    pub fn height(&self) -> usize {
        self.height as usize
    }
    pub fn cpu_of_slot(&self, slot: usize) -> u32 {
        self.cpu_of_slot[slot]
    }
}

fn check_slot_count(slots: usize) -> Result<(), FanoutError> {
    if slots == 0 || slots > SLOTS_MAX {
        return Err(FanoutError::BadSlotCount { slots, max: SLOTS_MAX });
    }
    Ok(())
}

/// Children lists of a flat or balanced k-ary tree in pre-order.
fn kary_children(shape: Shape, slots: usize) -> Result<Vec<Vec<u16>>, FanoutError> {
    check_slot_count(slots)?;
    let mut children = vec![Vec::new(); slots];
    match shape {
        Shape::Flat => children[0] = (1..slots as u16).collect(),
        Shape::Kary(k) => split(&mut children, 0, slots, k as usize),
        Shape::Cpu => unreachable!("the cpu shape is built from sysfs"),
    }
    Ok(children)
}

/// Give the `end - root - 1` slots after `root` to at most `k` balanced
/// child subtrees (recursively), in pre-order.
fn split(children: &mut [Vec<u16>], root: usize, end: usize, k: usize) {
    let below = end - root - 1;
    let mut start = root + 1;
    for i in 0..k.min(below) {
        let size = below / k + usize::from(i < below % k);
        children[root].push(start as u16);
        split(children, start, start + size, k);
        start += size;
    }
    debug_assert_eq!(start, end, "the children of {root} cover its subtree");
}

/// Packages under the root, cores of a package as a 4-ary tree under its
/// first core, hyper-threads under their core; numbered in pre-order.
fn cpu_tree(cpus: &[(u32, u32, u32)]) -> Tree {
    // (package, core) -> cpus, in first-seen order.
    type Core = (u32, Vec<u32>);
    let mut packages: Vec<(u32, Vec<Core>)> = Vec::new();
    for &(package, core, cpu) in cpus {
        let p = match packages.iter().position(|p| p.0 == package) {
            Some(p) => p,
            None => {
                packages.push((package, Vec::new()));
                packages.len() - 1
            }
        };
        match packages[p].1.iter_mut().find(|c| c.0 == core) {
            Some(c) => c.1.push(cpu),
            None => packages[p].1.push((core, vec![cpu])),
        }
    }
    let mut children: Vec<Vec<u16>> = Vec::new();
    let mut cpu_of_slot = Vec::new();
    // A package: its cores as a 4-ary tree; the first core's first thread
    // is the package's root slot.
    fn add_cores(cores: &[(u32, Vec<u32>)], children: &mut Vec<Vec<u16>>, cpu_of_slot: &mut Vec<u32>) -> u16 {
        let root = children.len() as u16;
        let (_, threads) = &cores[0];
        children.push(Vec::new());
        cpu_of_slot.push(threads[0]);
        for &t in &threads[1..] {
            let s = children.len() as u16;
            children.push(Vec::new());
            cpu_of_slot.push(t);
            children[root as usize].push(s);
        }
        let rest = &cores[1..];
        let k = 4usize;
        let mut start = 0;
        for i in 0..k.min(rest.len()) {
            let size = rest.len() / k + usize::from(i < rest.len() % k);
            let child = add_cores(&rest[start..start + size], children, cpu_of_slot);
            children[root as usize].push(child);
            start += size;
        }
        root
    }
    let root = add_cores(&packages[0].1, &mut children, &mut cpu_of_slot);
    for (_, cores) in &packages[1..] {
        let child = add_cores(cores, &mut children, &mut cpu_of_slot);
        children[root as usize].push(child);
    }
    Tree::from_children(Shape::Cpu, children, cpu_of_slot).expect("a cpu tree of at most SLOTS_MAX cpus")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_tree_of_seven_is_the_textbook_one() {
        let t = Tree::build(Shape::Kary(2), 7).unwrap();
        assert_eq!(t.children(0), &[1, 4]);
        assert_eq!(t.children(1), &[2, 3]);
        assert_eq!(t.children(4), &[5, 6]);
        assert_eq!(t.subtree_end(1), 4);
        assert_eq!(t.height(), 2);
        assert_eq!(t.parent(6), Some(4));
    }

    #[test]
    fn flat_tree_has_every_slot_under_the_root() {
        let t = Tree::build(Shape::Flat, 5).unwrap();
        assert_eq!(t.children(0), &[1, 2, 3, 4]);
        assert_eq!(t.height(), 1);
    }

    #[test]
    fn every_shape_and_size_is_contiguous_preorder() {
        for slots in 1..=SLOTS_MAX {
            for shape in [Shape::Flat, Shape::Kary(2), Shape::Kary(3), Shape::Kary(8)] {
                let t = Tree::build(shape, slots).unwrap();
                assert_eq!(t.slots(), slots);
            }
        }
    }

    #[test]
    fn cpu_tree_groups_threads_under_cores_and_cores_under_packages() {
        let dir = std::env::temp_dir().join(format!("fanout-sysfs-{}", std::process::id()));
        // 2 packages x 2 cores x 2 threads: cpu = package*4 + core*2 + thread.
        for cpu in 0..8u32 {
            let topo = dir.join(format!("cpu{cpu}/topology"));
            std::fs::create_dir_all(&topo).unwrap();
            std::fs::write(topo.join("physical_package_id"), format!("{}\n", cpu / 4)).unwrap();
            std::fs::write(topo.join("core_id"), format!("{}\n", (cpu / 2) % 2)).unwrap();
        }
        let t = Tree::from_sysfs(&dir, 8).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        // root = cpu0: its thread sibling, its package's other core, then package 1's root.
        assert_eq!(t.cpu_of_slot(0), 0);
        assert_eq!(t.children(0).len(), 3);
        let sibling = t.children(0)[0] as usize;
        assert_eq!(t.cpu_of_slot(sibling), 1);
        let package1 = *t.children(0).last().unwrap() as usize;
        assert_eq!(t.cpu_of_slot(package1), 4);
        assert_eq!(t.subtree_end(package1), 8);
    }

    #[test]
    fn too_small_a_topology_and_bad_counts_are_refused() {
        let dir = std::env::temp_dir().join(format!("fanout-sysfs-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = Tree::from_sysfs(&dir, 4).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.to_string().contains("4 slots"), "{e}");
        assert!(Tree::build(Shape::Flat, 0).is_err());
        assert!(Tree::build(Shape::Flat, SLOTS_MAX + 1).is_err());
        assert!(Shape::parse("kary:1").is_err());
        assert_eq!(Shape::parse("kary:4").unwrap(), Shape::Kary(4));
    }

    #[test]
    fn slot_set_range_summary_matches_a_scan() {
        let mut s = SlotSet::default();
        for slot in [3, 63, 64, 130, 255] {
            s.insert(slot);
        }
        for start in 0..SLOTS_MAX {
            for end in start..=SLOTS_MAX.min(start + 140) {
                let scan = (start..end).any(|x| s.contains(x));
                assert_eq!(s.any_in(start, end), scan, "[{start},{end})");
            }
        }
        assert_eq!(s.len(), 5);
    }
}
