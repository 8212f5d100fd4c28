//! The predicate engine: predicates over a state `S` (typically a view of
//! the SST plus protocol state) and the triggers that fire when they hold.
//! One progress loop calls [`Predicates::evaluate`]; a trigger handles
//! everything that is ready (batching is natural) and returns how much
//! work it did. No lock is held while a trigger runs: the engine is owned
//! by the progress loop, and triggers get `&mut S` directly.

/// Whether a predicate stays registered after its trigger fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredicateKind {
    /// Evaluated on every pass.
    Recurrent,
    /// Removed after its trigger fires once.
    OneTime,
}

type Predicate<S> = Box<dyn FnMut(&S) -> bool + Send>;
type Trigger<S, E> = Box<dyn FnMut(&mut S) -> Result<u32, E> + Send>;

struct Entry<S, E> {
    name: &'static str,
    kind: PredicateKind,
    predicate: Predicate<S>,
    trigger: Trigger<S, E>,
    fired: u64,
}

/// Registered predicates, evaluated in registration order.
pub struct Predicates<S, E> {
    entries: Vec<Entry<S, E>>,
    entries_max: usize,
}

impl<S, E> Predicates<S, E> {
    /// An engine that holds at most `entries_max` predicates.
    pub fn new(entries_max: usize) -> Self {
        Predicates {
            entries: Vec::with_capacity(entries_max),
            entries_max,
        }
    }

    /// Register `predicate` → `trigger`. Panics past `entries_max`: the set
    /// of predicates is fixed at start-up, so overflowing it is a bug.
    pub fn register(
        &mut self,
        name: &'static str,
        kind: PredicateKind,
        predicate: impl FnMut(&S) -> bool + Send + 'static,
        trigger: impl FnMut(&mut S) -> Result<u32, E> + Send + 'static,
    ) {
        assert!(
            self.entries.len() < self.entries_max,
            "more than {} predicates",
            self.entries_max
        );
        self.entries.push(Entry {
            name,
            kind,
            predicate: Box::new(predicate),
            trigger: Box::new(trigger),
            fired: 0,
        });
    }

    /// One pass: run the trigger of every predicate that holds. Returns the
    /// work done (sum of the triggers' counts).
    pub fn evaluate(&mut self, state: &mut S) -> Result<u32, E> {
        let mut work = 0u32;
        let mut i = 0;
        while i < self.entries.len() {
            let entry = &mut self.entries[i];
            if (entry.predicate)(state) {
                work = work.saturating_add((entry.trigger)(state)?);
                entry.fired += 1;
                if entry.kind == PredicateKind::OneTime {
                    self.entries.remove(i);
                    continue;
                }
            }
            i += 1;
        }
        Ok(work)
    }

    /// How often each predicate fired, by name.
    pub fn fired_counts(&self) -> Vec<(&'static str, u64)> {
        self.entries.iter().map(|e| (e.name, e.fired)).collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recurrent_fires_each_pass_and_one_time_once() {
        let mut p: Predicates<u32, ()> = Predicates::new(4);
        p.register(
            "always",
            PredicateKind::Recurrent,
            |_| true,
            |s| {
                *s += 1;
                Ok(1)
            },
        );
        p.register(
            "once",
            PredicateKind::OneTime,
            |s| *s >= 1,
            |s| {
                *s += 100;
                Ok(1)
            },
        );
        let mut s = 0;
        assert_eq!(p.evaluate(&mut s), Ok(2));
        assert_eq!(s, 101);
        assert_eq!(p.len(), 1, "one-time predicate removed after firing");
        assert_eq!(p.evaluate(&mut s), Ok(1));
        assert_eq!(s, 102);
    }

    #[test]
    fn false_predicate_does_not_fire() {
        let mut p: Predicates<u32, ()> = Predicates::new(1);
        p.register("never", PredicateKind::Recurrent, |_| false, |_| Ok(1));
        let mut s = 0;
        assert_eq!(p.evaluate(&mut s), Ok(0));
        assert_eq!(p.fired_counts(), vec![("never", 0)]);
    }
}
