//! A discrete-event model of the fanout protocol on a many-core, so the
//! evaluation can go past the cores of the machine it runs on. Every
//! result of it is *simulated* and must be labelled so.
//!
//! The model runs the same plan as the live domain ([`crate::plan`]):
//! the same sends, helps, skips, counters and acknowledgement chains, one
//! slot per core, and charges each step a cost from [`Params`]:
//!
//! ```text
//!  a line moves to another core     line_transfer_ns (a ping-pong round
//!                                   trip is 4 of them; a line is a serial
//!                                   resource: transfers queue on it)
//!  a send (mailbox stores + fence)  send_ns, then the line's transfer
//!  noticing a message               a poll delay drawn in [0, poll_ns)
//!                                   (a member spinning on its mailbox) or
//!                                   wake_ns (a non-member interrupted)
//!  visiting a scatter node          visit_ns (its plan: the range tests)
//!  an atomic decrement              the line's transfer + atomic_ns
//!                                   (held for both: contended ones queue)
//!  the handler                      handler_ns
//! ```
//!
//! A handler runs to completion once it starts (its core is busy); line
//! contention is charged in the order the events are processed. Initially
//! each slot's mailbox and gather lines are on its own core and the
//! completion line on the origin's.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;

use crate::plan::{ack_count, acks_itself, child_action, ChildAction, Layout};
use crate::topology::{SlotSet, Tree};

/// The costs of the model, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    pub line_transfer_ns: f64,
    pub send_ns: f64,
    pub poll_ns: f64,
    pub handler_ns: f64,
    pub atomic_ns: f64,
    pub wake_ns: f64,
    pub visit_ns: f64,
}

impl Params {
    /// Costs of a typical x86 server core-to-core (the model's tests use
    /// these; `spindle fanout calibrate` measures a machine's own).
    pub const TYPICAL_X86: Params = Params {
        line_transfer_ns: 40.0,
        send_ns: 20.0,
        poll_ns: 20.0,
        handler_ns: 50.0,
        atomic_ns: 10.0,
        wake_ns: 2_000.0,
        visit_ns: 5.0,
    };
}

/// Median and 99th percentile of one simulated curve point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub members: usize,
    pub latency_ns_p50: f64,
    pub latency_ns_p99: f64,
}

const COMPLETE: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Line {
    owner: usize,
    free_at: f64,
}

/// An event: a message landed in `slot`'s mailbox at `at`.
#[derive(Clone, Copy, PartialEq)]
struct Arrival {
    at: f64,
    order: u64,
    slot: usize,
    ack_to: usize,
}

impl Eq for Arrival {}
impl PartialOrd for Arrival {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Arrival {
    /// Earliest first (a max-heap reversed); ties in issue order.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        other.at.total_cmp(&self.at).then(other.order.cmp(&self.order))
    }
}

/// A small deterministic generator (splitmix64).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

struct Sim<'a> {
    tree: &'a Tree,
    layout: Layout,
    p: Params,
    targets: SlotSet,
    origin: usize,
    lines: Vec<Line>,
    core_free: Vec<f64>,
    pending: Vec<u32>,
    ack_to: Vec<usize>,
    acked_at: Vec<f64>,
    done_at: Option<f64>,
    queue: BinaryHeap<Arrival>,
    order: u64,
    rng: &'a mut Rng,
}

impl Sim<'_> {
    fn mailbox(&self, slot: usize) -> usize {
        slot
    }
    fn gather(&self, slot: usize) -> usize {
        self.tree.slots() + slot
    }
    fn completion(&self) -> usize {
        2 * self.tree.slots()
    }

    /// `core` gets `line` at or after `t`: when it has it.
    fn access(&mut self, line: usize, core: usize, t: f64, hold_ns: f64) -> f64 {
        let l = &mut self.lines[line];
        if l.owner == core && l.free_at <= t {
            return t + hold_ns;
        }
        let start = t.max(l.free_at);
        let end = start + if l.owner == core { 0.0 } else { self.p.line_transfer_ns } + hold_ns;
        l.free_at = end;
        l.owner = core;
        end
    }

    fn send(&mut self, core: usize, child: usize, ack_to: usize, t: f64) -> f64 {
        let t = self.access(self.mailbox(child), core, t + self.p.send_ns, 0.0);
        self.order += 1;
        self.queue.push(Arrival {
            at: t,
            order: self.order,
            slot: child,
            ack_to,
        });
        t
    }

    /// The scatter of `slot` done on `core` from `t`: (time after, where
    /// `slot`'s own acknowledgement goes).
    fn scatter(&mut self, slot: usize, core: usize, mut t: f64, ack_to: usize) -> (f64, usize) {
        t += self.p.visit_ns;
        let mine = match ack_count(self.tree, self.layout, slot, &self.targets) {
            0 => return (self.ack(ack_to, core, t), ack_to),
            1 => ack_to,
            count => {
                t = self.access(self.gather(slot), core, t, 0.0);
                self.pending[slot] = count;
                self.ack_to[slot] = ack_to;
                slot
            }
        };
        for i in 0..self.tree.children(slot).len() {
            let child = self.tree.children(slot)[i] as usize;
            match child_action(self.tree, self.layout, child, &self.targets) {
                ChildAction::Send => t = self.send(core, child, mine, t),
                ChildAction::Help => t = self.scatter(child, core, t, mine).0,
                ChildAction::Skip => {}
            }
        }
        (t, mine)
    }

    fn ack(&mut self, mut node: usize, core: usize, mut t: f64) -> f64 {
        loop {
            if node == COMPLETE {
                t = self.access(self.completion(), core, t, 0.0);
                assert!(self.done_at.is_none(), "completes_once");
                self.done_at = Some(t);
                return t;
            }
            t = self.access(self.gather(node), core, t, self.p.atomic_ns);
            assert!(self.pending[node] >= 1, "acks_never_exceed_the_count");
            self.pending[node] -= 1;
            if self.pending[node] > 0 {
                return t;
            }
            node = self.ack_to[node];
        }
    }

    fn arrive(&mut self, a: Arrival) {
        let core = a.slot;
        // A broadcast interrupts a non-member (busy elsewhere); the origin
        // is polling its own mailbox while it waits.
        let interrupted = self.layout == Layout::Tree && !self.targets.contains(a.slot) && a.slot != self.origin;
        let notice = a.at
            + if interrupted {
                self.p.wake_ns
            } else {
                self.rng.unit() * self.p.poll_ns
            };
        let mut t = self.access(self.mailbox(a.slot), core, notice.max(self.core_free[core]), 0.0);
        let mine = if self.layout == Layout::Flat {
            a.ack_to
        } else {
            let (after, mine) = self.scatter(a.slot, core, t, a.ack_to);
            t = after;
            mine
        };
        if self.targets.contains(a.slot) {
            t += self.p.handler_ns;
        }
        if self.layout == Layout::Flat {
            self.acked_at[a.slot] = t;
        } else {
            debug_assert!(acks_itself(self.layout, a.slot, &self.targets));
            t = self.ack(mine, core, t);
        }
        self.core_free[core] = t;
    }
}

/// One multicast from `origin` to `targets` (not holding `origin`): the
/// origin's latency from the call to seeing every acknowledgement.
pub fn simulate(tree: &Tree, layout: Layout, p: Params, origin: usize, targets: SlotSet, rng: &mut Rng) -> f64 {
    assert!(!targets.contains(origin), "the origin is not its own target");
    let slots = tree.slots();
    let mut lines: Vec<Line> = (0..2 * slots)
        .map(|i| Line {
            owner: i % slots,
            free_at: 0.0,
        })
        .collect();
    lines.push(Line {
        owner: origin,
        free_at: 0.0,
    });
    let mut sim = Sim {
        tree,
        layout,
        p,
        targets,
        origin,
        lines,
        core_free: vec![0.0; slots],
        pending: vec![0; slots],
        ack_to: vec![COMPLETE; slots],
        acked_at: vec![f64::NAN; slots],
        done_at: None,
        queue: BinaryHeap::new(),
        order: 0,
        rng,
    };
    let mut t = 0.0;
    match layout {
        Layout::Flat => {
            for target in targets.iter() {
                t = sim.send(origin, target, COMPLETE, t);
            }
        }
        Layout::Tree if origin == 0 => {
            let (after, mine) = sim.scatter(0, origin, t, COMPLETE);
            t = sim.ack(mine, origin, after);
        }
        Layout::Tree => t = sim.send(origin, 0, COMPLETE, t),
        Layout::TreeHelp | Layout::TreeHelpSkip => {
            if targets.is_empty() {
                sim.done_at = Some(t);
            } else if targets.contains(0) {
                t = sim.send(origin, 0, COMPLETE, t);
            } else {
                t = sim.scatter(0, origin, t, COMPLETE).0;
            }
        }
    }
    sim.core_free[origin] = t;
    let mut events = 0usize;
    while let Some(a) = sim.queue.pop() {
        events += 1;
        assert!(
            events <= 4 * slots + 4,
            "every slot receives at most once per multicast"
        );
        sim.arrive(a);
    }
    let seen = if layout == Layout::Flat {
        let mut t = t;
        for target in targets.iter() {
            let acked = sim.acked_at[target];
            assert!(acked.is_finite(), "every_target_acknowledges: slot {target}");
            t = t.max(acked) + p.line_transfer_ns;
        }
        t
    } else {
        let done = sim.done_at.expect("every_multicast_completes");
        if targets.is_empty() {
            done
        } else {
            done.max(t) + p.line_transfer_ns
        }
    };
    seen + sim.rng.unit() * p.poll_ns
}

/// The latency curve of `layout` over `group_sizes` (members including
/// the origin), `trials` random groups and origins each, seeded.
pub fn curve(tree: &Tree, layout: Layout, p: Params, group_sizes: &[usize], trials: usize, seed: u64) -> Vec<Point> {
    assert!(trials > 0, "a curve point needs trials");
    let mut rng = Rng::new(seed);
    let slots = tree.slots();
    let mut all: Vec<usize> = (0..slots).collect();
    group_sizes
        .iter()
        .map(|&members| {
            assert!((1..=slots).contains(&members), "group of {members} on {slots} slots");
            let mut latencies: Vec<f64> = (0..trials)
                .map(|_| {
                    for i in 0..members {
                        let j = i + rng.below(slots - i);
                        all.swap(i, j);
                    }
                    let origin = all[0];
                    let mut targets = SlotSet::default();
                    for &s in &all[1..members] {
                        targets.insert(s);
                    }
                    simulate(tree, layout, p, origin, targets, &mut rng)
                })
                .collect();
            latencies.sort_by(f64::total_cmp);
            let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
            Point {
                members,
                latency_ns_p50: at(0.50),
                latency_ns_p99: at(0.99),
            }
        })
        .collect()
}

/// The smallest group size from which `layout` has a lower median than
/// `baseline` at every larger size in `a`/`b` (same sizes), if any.
pub fn crossover(a: &[Point], b: &[Point]) -> Option<usize> {
    assert_eq!(a.len(), b.len(), "curves over the same group sizes");
    let mut from = None;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.members, y.members, "curves over the same group sizes");
        if x.latency_ns_p50 < y.latency_ns_p50 {
            from.get_or_insert(x.members);
        } else {
            from = None;
        }
    }
    from
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Shape;

    fn sizes(slots: usize) -> Vec<usize> {
        let mut v = vec![2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256];
        v.retain(|&s| s <= slots);
        v
    }

    #[test]
    fn the_model_is_deterministic_per_seed() {
        let tree = Tree::build(Shape::Kary(2), 64).unwrap();
        let a = curve(&tree, Layout::TreeHelpSkip, Params::TYPICAL_X86, &[2, 16, 64], 50, 7);
        let b = curve(&tree, Layout::TreeHelpSkip, Params::TYPICAL_X86, &[2, 16, 64], 50, 7);
        assert_eq!(a, b);
    }

    #[test]
    fn tree_help_skip_beats_flat_for_large_groups_with_a_crossover() {
        let tree = Tree::build(Shape::Kary(2), 256).unwrap();
        let sizes = sizes(256);
        let flat = curve(&tree, Layout::Flat, Params::TYPICAL_X86, &sizes, 40, 1);
        let skip = curve(&tree, Layout::TreeHelpSkip, Params::TYPICAL_X86, &sizes, 40, 1);
        let from = crossover(&skip, &flat).expect("tree_help_skip overtakes flat");
        assert!(from > 2 && from < 256, "crossover at {from} members");
        let (f, s) = (flat.last().unwrap(), skip.last().unwrap());
        assert!(
            s.latency_ns_p50 * 2.0 < f.latency_ns_p50,
            "256 members: skip {s:?} flat {f:?}"
        );
    }

    #[test]
    fn skipping_removes_the_small_group_penalty_of_helping() {
        let tree = Tree::build(Shape::Kary(2), 256).unwrap();
        let small = [2, 3, 4];
        let flat = curve(&tree, Layout::Flat, Params::TYPICAL_X86, &small, 60, 2);
        let help = curve(&tree, Layout::TreeHelp, Params::TYPICAL_X86, &small, 60, 2);
        let skip = curve(&tree, Layout::TreeHelpSkip, Params::TYPICAL_X86, &small, 60, 2);
        for i in 0..small.len() {
            let (f, h, s) = (flat[i].latency_ns_p50, help[i].latency_ns_p50, skip[i].latency_ns_p50);
            assert!(h > 3.0 * f, "helping alone pays for the whole tree: help {h} flat {f}");
            assert!(s < h / 3.0, "skipping removes it: skip {s} help {h}");
            assert!(s < 2.0 * f, "small groups: skip {s} within 2x of flat {f}");
        }
    }

    #[test]
    fn a_broadcast_interrupts_non_members_and_pays_for_it() {
        let tree = Tree::build(Shape::Kary(2), 64).unwrap();
        let tree_only = curve(&tree, Layout::Tree, Params::TYPICAL_X86, &[2], 30, 3)[0];
        let skip = curve(&tree, Layout::TreeHelpSkip, Params::TYPICAL_X86, &[2], 30, 3)[0];
        assert!(tree_only.latency_ns_p50 > Params::TYPICAL_X86.wake_ns, "{tree_only:?}");
        assert!(skip.latency_ns_p50 < Params::TYPICAL_X86.wake_ns, "{skip:?}");
    }

    #[test]
    fn a_two_member_multicast_costs_a_few_line_transfers() {
        let p = Params {
            poll_ns: 0.0,
            ..Params::TYPICAL_X86
        };
        let tree = Tree::build(Shape::Kary(2), 2).unwrap();
        let mut targets = SlotSet::default();
        targets.insert(1);
        for layout in [Layout::Flat, Layout::TreeHelpSkip] {
            let t = simulate(&tree, layout, p, 0, targets, &mut Rng::new(1));
            // The origin's write pulls the mailbox, the target's read pulls
            // it back; the same for the acknowledgement: 4 transfers, as
            // in a ping-pong round trip.
            let transfers = 4.0 * p.line_transfer_ns;
            assert!(
                t >= transfers && t <= transfers + p.send_ns + p.handler_ns + 2.0 * p.visit_ns + p.atomic_ns,
                "{layout:?}: {t}"
            );
        }
    }
}
