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

/// The acknowledgements gather node `slot` combines: its own (if it acks
/// itself) and one per child that is sent to or helped. 0 means the node
/// completes at once; 1 means it needs no counter (its one contribution
/// acknowledges straight to the node's own acknowledgement target).
#[inline]
pub fn ack_count(tree: &Tree, layout: Layout, slot: usize, targets: &SlotSet) -> u32 {
    let own = u32::from(acks_itself(layout, slot, targets));
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
}
