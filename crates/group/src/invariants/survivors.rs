//! What [`super::no_loss`] and [`super::virtual_synchrony`] both need: per
//! member, the set of messages it delivered in each view, and per view the
//! first member to move past it (the reference) with its set.

use std::collections::{BTreeSet, HashMap};

use super::checker::{Context, Delivered, Event, Installed};

/// A set of `(sender, index)` delivered in one view.
pub type Set = BTreeSet<(usize, u64)>;

/// A member leaving view `from` for `to`, with what it delivered in `from`.
pub struct Move {
    pub member: usize,
    pub from: u64,
    pub to: u64,
    pub set: Set,
}

#[derive(Default)]
pub struct Survivors {
    /// Per (member, view): what it delivered in the view.
    sets: HashMap<(usize, u64), Set>,
    /// Per view: the first member that moved past it, with its set.
    references: HashMap<u64, (usize, Set)>,
}

impl Survivors {
    pub fn delivered(&mut self, d: &Delivered) {
        self.sets
            .entry((d.member, d.view))
            .or_default()
            .insert((d.sender, d.index));
    }

    /// Take one event: a delivery is recorded (None); a view installation
    /// gives the move it makes, with the installation.
    pub fn observe<'e>(&mut self, ctx: &Context, event: &'e Event<'e>) -> Option<(Move, &'e Installed<'e>)> {
        match event {
            Event::Delivery(d) => {
                self.delivered(d);
                None
            }
            Event::View(v) => self.moving(ctx, v).map(|mv| (mv, v)),
        }
    }

    /// The move a view installation makes (None: the member had no view,
    /// or confirms or goes back to one, which the view chain names).
    pub fn moving(&mut self, ctx: &Context, v: &Installed<'_>) -> Option<Move> {
        let from = ctx.view_of(v.member).filter(|cur| *cur < v.view)?;
        Some(Move {
            member: v.member,
            from,
            to: v.view,
            set: self.sets.remove(&(v.member, from)).unwrap_or_default(),
        })
    }

    /// The reference of `view`, if some member moved past it.
    pub fn reference(&self, view: u64) -> Option<&(usize, Set)> {
        self.references.get(&view)
    }

    /// `mv` is the first to move past its view: it becomes the reference.
    pub fn set_reference(&mut self, mv: Move) {
        let previous = self.references.insert(mv.from, (mv.member, mv.set));
        debug_assert!(previous.is_none(), "one reference per view");
    }
}
