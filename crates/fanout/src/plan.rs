//! What a scatter node does with a multicast: how many acknowledgements
//! its gather node combines, and what each child gets (a send, help, or
//! nothing). Pure functions of the tree, the layout and the snapshot of
//! targets: the live domain and the model both follow them.

use crate::error::FanoutError;
use crate::topology::{SlotSet, Tree};

/// How a multicast travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// The origin writes every target's mailbox and polls one acknowledgement
    /// flag per target: Linux's `smp_call_function_many`.
    Flat,
    /// A broadcast down the static tree: every slot's thread forwards
    /// (non-members are interrupted), acknowledgements combine upward.
    Tree,
    /// The tree, where a member (or the origin) forwards on behalf of every
    /// non-member scatter node it reaches instead of interrupting it.
    TreeHelp,
    /// Helping, and subtrees without a target are jumped over.
    TreeHelpSkip,
}

impl Layout {
    pub const ALL: [Layout; 4] = [Layout::Flat, Layout::Tree, Layout::TreeHelp, Layout::TreeHelpSkip];

    /// The name used in JSON rows and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Flat => "flat",
            Layout::Tree => "tree",
            Layout::TreeHelp => "tree_help",
            Layout::TreeHelpSkip => "tree_help_skip",
        }
    }

    pub fn parse(s: &str) -> Result<Layout, FanoutError> {
        Layout::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| FanoutError::BadLayout { layout: s.to_string() })
    }

    /// Whether every slot of the tree must be served by a thread (the
    /// broadcast interrupts non-members).
    pub fn interrupts_non_members(self) -> bool {
        self == Layout::Tree
    }
}

/// What a scatter node does for one child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildAction {
    /// Write the child's mailbox: its thread forwards further.
    Send,
    /// Do the child's scatter here, on its behalf (it is not a target).
    Help,
    /// The child's subtree holds no target: nothing.
    Skip,
}

/// Whether `slot` acknowledges for itself in this multicast: a target
/// does; in a broadcast every node does (after forwarding).
#[inline]
pub fn acks_itself(layout: Layout, slot: usize, targets: &SlotSet) -> bool {
    layout == Layout::Tree || targets.contains(slot)
}

#[inline]
pub fn child_action(tree: &Tree, layout: Layout, child: usize, targets: &SlotSet) -> ChildAction {
    match layout {
        Layout::Flat => unreachable!("a flat multicast has no scatter nodes below the origin"),
        Layout::Tree => ChildAction::Send,
        Layout::TreeHelp if targets.contains(child) => ChildAction::Send,
        Layout::TreeHelp => ChildAction::Help,
        Layout::TreeHelpSkip if !targets.any_in(child, tree.subtree_end(child)) => ChildAction::Skip,
        Layout::TreeHelpSkip if targets.contains(child) => ChildAction::Send,
        Layout::TreeHelpSkip => ChildAction::Help,
    }
}

/// The children of `slot` a skipping scatter visits (those whose subtree
/// holds a target) with what each gets (`Send` or `Help`), in order.
/// Subtrees are contiguous in pre-order, so this steps from one target
/// to the next by bit scans ([`SlotSet::next_from`]) and a binary search
/// of the children: a skipped subtree costs nothing, where testing
/// every child's summary cost one range test per child.
#[inline]
pub fn visited_children<'a>(
    tree: &'a Tree,
    slot: usize,
    targets: &'a SlotSet,
) -> impl Iterator<Item = (usize, ChildAction)> + 'a {
    let children = tree.children(slot);
    let end = tree.subtree_end(slot);
    let mut from = slot + 1;
    std::iter::from_fn(move || {
        let target = targets.next_from(from).filter(|&t| t < end)?;
        // The last child at or before the target holds it (the first
        // child is slot + 1 <= target: the index is at least 0).
        let child = children[children.partition_point(|&c| c as usize <= target) - 1] as usize;
        from = tree.subtree_end(child);
        let action = if targets.contains(child) {
            ChildAction::Send
        } else {
            ChildAction::Help
        };
        debug_assert_eq!(
            action,
            child_action(tree, Layout::TreeHelpSkip, child, targets),
            "skipping_visits_exactly_the_subtrees_with_a_target"
        );
        Some((child, action))
    })
}

/// The acknowledgements gather node `slot` combines: its own (if it acks
/// itself) and one per child that is sent to or helped. 0 means the node
/// completes at once; 1 means it needs no counter (its one contribution
/// acknowledges straight to the node's own acknowledgement target).
#[inline]
pub fn ack_count(tree: &Tree, layout: Layout, slot: usize, targets: &SlotSet) -> u32 {
    let own = u32::from(acks_itself(layout, slot, targets));
    if layout == Layout::TreeHelpSkip {
        return own + visited_children(tree, slot, targets).count() as u32;
    }
    let children = tree
        .children(slot)
        .iter()
        .filter(|&&c| child_action(tree, layout, c as usize, targets) != ChildAction::Skip)
        .count() as u32;
    own + children
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Shape;

    #[test]
    fn skipping_counts_only_subtrees_with_a_target() {
        let t = Tree::build(Shape::Kary(2), 7).unwrap();
        let mut targets = SlotSet::default();
        targets.insert(5);
        assert_eq!(ack_count(&t, Layout::TreeHelpSkip, 0, &targets), 1, "only subtree(4)");
        assert_eq!(child_action(&t, Layout::TreeHelpSkip, 1, &targets), ChildAction::Skip);
        assert_eq!(child_action(&t, Layout::TreeHelpSkip, 4, &targets), ChildAction::Help);
        assert_eq!(child_action(&t, Layout::TreeHelpSkip, 5, &targets), ChildAction::Send);
        assert_eq!(ack_count(&t, Layout::TreeHelp, 0, &targets), 2, "helping visits both");
        assert_eq!(ack_count(&t, Layout::TreeHelp, 2, &targets), 0, "an empty helped leaf");
        assert_eq!(ack_count(&t, Layout::Tree, 0, &targets), 3, "broadcast: self + 2");
        assert_eq!(Layout::parse("tree_help").unwrap(), Layout::TreeHelp);
        assert!(Layout::parse("tree-help").is_err());
    }

    /// `visited_children` is the children `child_action` does not skip,
    /// with the same action, for every tree shape and size up to 63 slots
    /// and pseudo-random target sets (a fixed xorshift: deterministic).
    #[test]
    fn visited_children_are_the_children_not_skipped() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for slots in 1..=63usize {
            for shape in [Shape::Kary(2), Shape::Kary(4), Shape::Flat] {
                let t = Tree::build(shape, slots).unwrap();
                for _ in 0..50 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let word = (x & (x >> 3)) & ((1u64 << slots) - 1).max(1);
                    let set = SlotSet::from_word(word);
                    for slot in 0..slots {
                        let slow: Vec<_> = t
                            .children(slot)
                            .iter()
                            .map(|&c| (c as usize, child_action(&t, Layout::TreeHelpSkip, c as usize, &set)))
                            .filter(|&(_, a)| a != ChildAction::Skip)
                            .collect();
                        let fast: Vec<_> = visited_children(&t, slot, &set).collect();
                        assert_eq!(fast, slow, "{shape:?} {slots} slots, slot {slot}, set {word:#b}");
                    }
                }
            }
        }
    }

    #[test]
    fn slot_set_iterates_by_bit_scans() {
        let mut set = SlotSet::default();
        for s in [0, 5, 63, 64, 130, 255] {
            set.insert(s);
        }
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 5, 63, 64, 130, 255]);
        assert_eq!(set.next_from(6), Some(63));
        assert_eq!(set.next_from(131), Some(255));
        assert_eq!(SlotSet::default().next_from(0), None);
        assert_eq!(set.next_from(256), None);
    }
}
