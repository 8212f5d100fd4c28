//! Subgroups and shards: which members of a view carry which replicated
//! service (Derecho's `SubgroupInfo`).
//!
//! A top-level group's members are laid out into *subgroups* (one per
//! replicated service, each with its own senders, delivery mode and total
//! order), and each subgroup into *shards*: disjoint sets of members, so
//! that a key `k` of a sharded map lives on shard `shard_of_key(k)` of
//! its subgroup only.
//!
//! ```text
//!  view 4: members 0 1 2 3 4 5
//!  ┌──────────── subgroup "kv" (2 shards × 2) ─────────┐ ┌─ "log" (1 × 2) ─┐
//!  │ shard 0: {0, 1}            shard 1: {2, 3}         │ │ shard 0: {4, 5} │
//!  └───────────────────────────────────────────────────┘ └─────────────────┘
//!  member 2 fails → view 5: members 0 1 3 4 5 (+ a joiner 6)
//!    kv shard 0 {0, 1} (kept)   kv shard 1 {6, 3} (3 kept at shard rank 1,
//!                                                  6 takes 2's shard rank 0)
//! ```
//!
//! The layout is a pure function of the view (and the previous layout),
//! recomputed at every view change, so every member computes the same
//! one without a message: [`LayoutFunction`]. The default,
//! [`StickyLayout`], keeps every surviving member in the shards it was in,
//! at the same shard rank (its replicated state stays where it is, and
//! its rank in the shard's group does not change), and fills the holes a
//! departed member left, at its shard rank, with the view's members that
//! no shard holds yet, lowest rank first; a
//! subgroup marked `overlapping` draws from all members instead, so a
//! member may belong to several subgroups. A view too small for the
//! specification is *inadequate* ([`LayoutError::Inadequate`]): the
//! application waits for joiners rather than run a shard short of its
//! replicas.
//!
//! Messages of a shard are multicast in that shard's own group (its own
//! ring, senders, delivery mode and total order): [`shard_group_name`]
//! names it, so every member of the shard opens the same one.

use crate::config::{DeliveryMode, SenderSet};

/// Largest number of subgroups in one layout.
pub const SUBGROUPS_MAX: usize = 64;
/// Largest number of shards of one subgroup.
pub const SHARDS_MAX: usize = 64;

/// One subgroup of the specification: how many shards, how many members
/// each, and how its messages are delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubgroupSpec {
    /// The subgroup's name (letters, digits, `-` and `_`; part of the
    /// shard groups' names).
    pub name: String,
    /// Shards of the subgroup (`1..=SHARDS_MAX`).
    pub shards: usize,
    /// Members of each shard (its replicas; at least 1).
    pub members_per_shard: usize,
    /// How each shard delivers its messages.
    pub mode: DeliveryMode,
    /// Which members of a shard send (by rank within the shard).
    pub senders: SenderSet,
    /// Draw this subgroup's members from every member of the view (so a
    /// member may also be in other subgroups), not only from the members
    /// no earlier subgroup holds.
    pub overlapping: bool,
}

impl SubgroupSpec {
    /// A subgroup of `shards` shards of `members_per_shard` members each,
    /// ordered, every member of a shard sends, disjoint from the others.
    pub fn new(name: &str, shards: usize, members_per_shard: usize) -> SubgroupSpec {
        SubgroupSpec {
            name: name.to_string(),
            shards,
            members_per_shard,
            mode: DeliveryMode::Ordered,
            senders: SenderSet::All,
            overlapping: false,
        }
    }

    fn validate(&self) -> Result<(), LayoutError> {
        let bad = |why: String| {
            Err(LayoutError::BadSpec {
                name: self.name.clone(),
                why,
            })
        };
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 32
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name_ok {
            return bad("a name is 1 to 32 letters, digits, '-' or '_'".into());
        }
        if self.shards == 0 || self.shards > SHARDS_MAX {
            return bad(format!("shards {} must be in 1..={SHARDS_MAX}", self.shards));
        }
        if self.members_per_shard == 0 || self.members_per_shard > 64 {
            return bad(format!(
                "members_per_shard {} must be in 1..=64",
                self.members_per_shard
            ));
        }
        if let SenderSet::Ranks(ranks) = &self.senders {
            if let Some(r) = ranks.iter().find(|r| **r >= self.members_per_shard) {
                return bad(format!(
                    "sender rank {r} is not a rank of a {}-member shard",
                    self.members_per_shard
                ));
            }
        }
        Ok(())
    }
}

/// What went wrong laying out a view.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("subgroup {name:?}: {why}")]
    BadSpec { name: String, why: String },
    #[error("two subgroups are named {0:?}")]
    DuplicateName(String),
    #[error("{count} subgroups: at most {SUBGROUPS_MAX}")]
    TooManySubgroups { count: usize },
    #[error(
        "the view is inadequate: subgroup {subgroup:?} shard {shard} needs {need} members and only {have} are free \
         (the view has {view_members}; wait for joiners or ask for fewer shards or members)"
    )]
    Inadequate {
        subgroup: String,
        shard: usize,
        need: usize,
        have: usize,
        view_members: usize,
    },
    #[error("layout function: {0}")]
    Custom(String),
}

/// The members of each shard of each subgroup, for one view. Members are
/// the top-level group's ranks; within a shard they are in the order
/// that gives them their shard rank (index in the vector).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The view this layout is of.
    pub view_id: u64,
    /// By subgroup (in the specification's order), by shard: members.
    pub shards: Vec<Vec<Vec<usize>>>,
}

impl Layout {
    /// The shards `member` belongs to: `(subgroup index, shard index,
    /// rank within the shard)`.
    pub fn shards_of(&self, member: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.shards.iter().enumerate().flat_map(move |(g, shards)| {
            shards
                .iter()
                .enumerate()
                .filter_map(move |(s, members)| members.iter().position(|m| *m == member).map(|rank| (g, s, rank)))
        })
    }

    /// The members of shard `shard` of subgroup `subgroup`.
    pub fn members(&self, subgroup: usize, shard: usize) -> Option<&[usize]> {
        self.shards.get(subgroup)?.get(shard).map(|m| m.as_slice())
    }

    /// Append this layout's bytes to `out` (the state a member joining
    /// the top-level group is given, so that it lays out the next view
    /// from the same previous layout as everyone else).
    ///
    /// ```text
    ///  u64 view_id | then per subgroup, per shard, in order:
    ///  u32 count   | count × u32 member      (all little-endian)
    /// ```
    ///
    /// The shape (subgroups, shards) is the specification's, so it is not
    /// stored; [`Layout::decode`] takes the specification.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.view_id.to_le_bytes());
        for members in self.shards.iter().flatten() {
            out.extend_from_slice(&(members.len() as u32).to_le_bytes());
            for m in members {
                out.extend_from_slice(&(*m as u32).to_le_bytes());
            }
        }
    }

    /// Read a layout written by [`Layout::encode`] for `specs`, every
    /// member below `members`; says what is wrong with bytes that are not
    /// one (short, too long, a shard of the wrong size, a rank out of
    /// range).
    pub fn decode(bytes: &[u8], specs: &[SubgroupSpec], members: usize) -> Result<Layout, String> {
        let mut at = 0usize;
        let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
            let piece = bytes
                .get(at..at + n)
                .ok_or_else(|| format!("a layout of {} bytes ends inside {what} at byte {at}", bytes.len()))?;
            at += n;
            Ok(piece)
        };
        let view_id = u64::from_le_bytes(take(8, "the view id")?.try_into().expect("8 bytes"));
        let mut shards = Vec::with_capacity(specs.len().min(SUBGROUPS_MAX));
        for spec in specs.iter().take(SUBGROUPS_MAX) {
            let mut of_spec = Vec::with_capacity(spec.shards.min(SHARDS_MAX));
            for s in 0..spec.shards.min(SHARDS_MAX) {
                let count = u32::from_le_bytes(take(4, "a shard's count")?.try_into().expect("4 bytes")) as usize;
                if count != spec.members_per_shard {
                    return Err(format!(
                        "shard {s} of subgroup {:?} has {count} members in the layout, the specification says {}",
                        spec.name, spec.members_per_shard
                    ));
                }
                let mut shard = Vec::with_capacity(count);
                for _ in 0..count {
                    let m = u32::from_le_bytes(take(4, "a member")?.try_into().expect("4 bytes")) as usize;
                    if m >= members {
                        return Err(format!(
                            "shard {s} of subgroup {:?} names member {m}; the group has {members}",
                            spec.name
                        ));
                    }
                    shard.push(m);
                }
                of_spec.push(shard);
            }
            shards.push(of_spec);
        }
        if at != bytes.len() {
            return Err(format!("{} bytes follow the layout's end", bytes.len() - at));
        }
        Ok(Layout { view_id, shards })
    }
}

/// Lays out a view: given the specification, the view's members
/// (ascending ranks) and the previous view's layout, the members of every
/// shard. Must be a pure function of its arguments: every member calls it
/// on its own and must get the same layout.
pub trait LayoutFunction: Send + Sync {
    fn layout(
        &self,
        specs: &[SubgroupSpec],
        view_id: u64,
        view_members: &[usize],
        previous: Option<&Layout>,
    ) -> Result<Layout, LayoutError>;
}

/// The default layout: survivors stay in their shards, holes are filled
/// with unheld members lowest rank first (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct StickyLayout;

impl LayoutFunction for StickyLayout {
    fn layout(
        &self,
        specs: &[SubgroupSpec],
        view_id: u64,
        view_members: &[usize],
        previous: Option<&Layout>,
    ) -> Result<Layout, LayoutError> {
        validate_specs(specs)?;
        // Members no disjoint subgroup holds yet, in rank order.
        let mut free: Vec<usize> = view_members.to_vec();
        free.sort_unstable();
        free.dedup();
        // Survivors first, each at its shard rank of the previous layout
        // (a departed member leaves a hole at its rank). Subgroups pair
        // with the previous layout's by position: the specification does
        // not change while a group runs.
        let all_slots: Vec<Vec<Vec<Option<usize>>>> = specs
            .iter()
            .enumerate()
            .map(|(g, spec)| {
                let before = previous
                    .and_then(|p| p.shards.get(g))
                    .filter(|s| s.len() == spec.shards);
                (0..spec.shards)
                    .map(|s| {
                        let kept = before.map(|b| b[s].as_slice()).unwrap_or(&[]);
                        let mut shard: Vec<Option<usize>> = kept
                            .iter()
                            .take(spec.members_per_shard)
                            .map(|m| view_members.contains(m).then_some(*m))
                            .collect();
                        shard.resize(spec.members_per_shard, None);
                        shard
                    })
                    .collect()
            })
            .collect();
        // The survivors a disjoint subgroup keeps: no other subgroup
        // fills a hole with them.
        let reserved: Vec<usize> = all_slots
            .iter()
            .zip(specs)
            .filter(|(_, spec)| !spec.overlapping)
            .flat_map(|(slots, _)| slots.iter().flatten().flatten().copied())
            .collect();
        let mut shards = Vec::with_capacity(specs.len());
        for (spec, slots) in specs.iter().zip(all_slots) {
            let mut pool: Vec<usize> = if spec.overlapping {
                let mut all = view_members.to_vec();
                all.sort_unstable();
                all.dedup();
                all
            } else {
                free.iter().copied().filter(|m| !reserved.contains(m)).collect()
            };
            let held: Vec<usize> = slots.iter().flatten().flatten().copied().collect();
            pool.retain(|m| !held.contains(m));
            let mut next = pool.into_iter();
            let mut layout: Vec<Vec<usize>> = Vec::with_capacity(spec.shards);
            for (s, shard) in slots.into_iter().enumerate() {
                let survivors = shard.iter().flatten().count();
                let mut filled = 0;
                let mut members = Vec::with_capacity(spec.members_per_shard);
                for slot in shard {
                    let member = match slot {
                        Some(m) => m,
                        None => match next.next() {
                            Some(m) => {
                                filled += 1;
                                m
                            }
                            None => {
                                return Err(LayoutError::Inadequate {
                                    subgroup: spec.name.clone(),
                                    shard: s,
                                    need: spec.members_per_shard,
                                    have: survivors + filled,
                                    view_members: view_members.len(),
                                })
                            }
                        },
                    };
                    members.push(member);
                }
                layout.push(members);
            }
            if !spec.overlapping {
                free.retain(|m| !layout.iter().flatten().any(|x| x == m));
            }
            shards.push(layout);
        }
        let layout = Layout { view_id, shards };
        check_layout(specs, view_members, &layout).map_err(LayoutError::Custom)?;
        Ok(layout)
    }
}

/// Check a specification: each subgroup valid, no more than
/// [`SUBGROUPS_MAX`] of them, names distinct.
pub fn validate_specs(specs: &[SubgroupSpec]) -> Result<(), LayoutError> {
    if specs.len() > SUBGROUPS_MAX {
        return Err(LayoutError::TooManySubgroups { count: specs.len() });
    }
    for (i, spec) in specs.iter().enumerate() {
        spec.validate()?;
        if specs[..i].iter().any(|s| s.name == spec.name) {
            return Err(LayoutError::DuplicateName(spec.name.clone()));
        }
    }
    Ok(())
}

/// Lay out `view_members` with `function`, check the result against the
/// specification (a user's function too), and return it.
pub fn lay_out(
    function: &dyn LayoutFunction,
    specs: &[SubgroupSpec],
    view_id: u64,
    view_members: &[usize],
    previous: Option<&Layout>,
) -> Result<Layout, LayoutError> {
    validate_specs(specs)?;
    let layout = function.layout(specs, view_id, view_members, previous)?;
    check_layout(specs, view_members, &layout).map_err(LayoutError::Custom)?;
    Ok(layout)
}

/// The layout invariants: every shard has its members, all of them in
/// the view, none twice in one subgroup (shards are disjoint), and a
/// non-overlapping subgroup shares no member with another one.
pub fn check_layout(specs: &[SubgroupSpec], view_members: &[usize], layout: &Layout) -> Result<(), String> {
    if layout.shards.len() != specs.len() {
        return Err(format!(
            "{} subgroups laid out, {} specified",
            layout.shards.len(),
            specs.len()
        ));
    }
    let mut disjoint_members: Vec<usize> = Vec::new();
    for (spec, shards) in specs.iter().zip(&layout.shards) {
        if shards.len() != spec.shards {
            return Err(format!(
                "subgroup {:?}: {} shards, {} specified",
                spec.name,
                shards.len(),
                spec.shards
            ));
        }
        let mut seen: Vec<usize> = Vec::new();
        for (s, members) in shards.iter().enumerate() {
            if members.len() != spec.members_per_shard {
                return Err(format!(
                    "subgroup {:?} shard {s}: {} members, {} specified",
                    spec.name,
                    members.len(),
                    spec.members_per_shard
                ));
            }
            for m in members {
                if !view_members.contains(m) {
                    return Err(format!(
                        "subgroup {:?} shard {s}: member {m} is not in the view",
                        spec.name
                    ));
                }
                if seen.contains(m) {
                    return Err(format!(
                        "subgroup {:?}: member {m} is in two shards (shards are disjoint)",
                        spec.name
                    ));
                }
                seen.push(*m);
            }
        }
        if !spec.overlapping {
            if let Some(m) = seen.iter().find(|m| disjoint_members.contains(m)) {
                return Err(format!(
                    "subgroup {:?}: member {m} is also in an earlier subgroup (not overlapping)",
                    spec.name
                ));
            }
            disjoint_members.extend(&seen);
        }
    }
    Ok(())
}

/// The shard of `key` in a subgroup of `shards` shards: FNV-1a 64 of the
/// key's bytes, mixed by MurmurHash3's 64-bit finalizer (FNV's low bits
/// alone depend only on the bytes' low bits), mod `shards`. Stable across
/// processes, builds and platforms.
pub fn shard_of_key(key: &[u8], shards: usize) -> usize {
    assert!(shards > 0, "a subgroup has at least one shard");
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^= hash >> 33;
    (hash % shards as u64) as usize
}

/// The name of the group that carries shard `shard` of subgroup
/// `subgroup` of group `group`: `{group}.{subgroup}.{shard}`.
pub fn shard_group_name(group: &str, subgroup: &str, shard: usize) -> String {
    format!("{group}.{subgroup}.{shard}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kv_and_log() -> Vec<SubgroupSpec> {
        vec![SubgroupSpec::new("kv", 2, 2), SubgroupSpec::new("log", 1, 2)]
    }

    #[test]
    fn the_first_view_is_laid_out_in_rank_order() {
        let layout = StickyLayout
            .layout(&kv_and_log(), 1, &[0, 1, 2, 3, 4, 5], None)
            .unwrap();
        assert_eq!(layout.shards, vec![vec![vec![0, 1], vec![2, 3]], vec![vec![4, 5]]]);
        assert_eq!(layout.shards_of(3).collect::<Vec<_>>(), vec![(0, 1, 1)]);
        assert_eq!(layout.members(1, 0), Some(&[4, 5][..]));
    }

    #[test]
    fn survivors_keep_their_shards_and_a_joiner_fills_the_hole() {
        let specs = kv_and_log();
        let first = StickyLayout.layout(&specs, 1, &[0, 1, 2, 3, 4, 5], None).unwrap();
        let next = StickyLayout
            .layout(&specs, 2, &[0, 1, 3, 4, 5, 6], Some(&first))
            .unwrap();
        // 6 takes member 2's place (shard rank 0); 3 keeps shard rank 1.
        assert_eq!(next.shards, vec![vec![vec![0, 1], vec![6, 3]], vec![vec![4, 5]]]);
    }

    #[test]
    fn a_layout_survives_its_bytes_and_bad_bytes_say_what_is_wrong() {
        let specs = kv_and_log();
        let layout = StickyLayout.layout(&specs, 7, &[0, 1, 3, 4, 5, 6], None).unwrap();
        let mut bytes = Vec::new();
        layout.encode(&mut bytes);
        assert_eq!(bytes.len(), 8 + 3 * (4 + 2 * 4));
        assert_eq!(Layout::decode(&bytes, &specs, 7).unwrap(), layout);
        let short = Layout::decode(&bytes[..bytes.len() - 1], &specs, 7).unwrap_err();
        assert!(short.contains("ends inside a member"), "{short}");
        let mut long = bytes.clone();
        long.push(0);
        assert!(Layout::decode(&long, &specs, 7).unwrap_err().contains("1 bytes follow"));
        assert!(Layout::decode(&bytes, &specs, 6)
            .unwrap_err()
            .contains("names member 6"));
        let other = vec![SubgroupSpec::new("kv", 2, 3), SubgroupSpec::new("log", 1, 2)];
        assert!(Layout::decode(&bytes, &other, 7).unwrap_err().contains("has 2 members"));
    }

    #[test]
    fn a_view_too_small_is_inadequate_and_says_where() {
        let err = StickyLayout
            .layout(&kv_and_log(), 1, &[0, 1, 2, 3, 4], None)
            .unwrap_err();
        assert_eq!(
            err,
            LayoutError::Inadequate {
                subgroup: "log".into(),
                shard: 0,
                need: 2,
                have: 1,
                view_members: 5
            }
        );
        assert!(err.to_string().contains("wait for joiners"), "{err}");
    }

    #[test]
    fn an_overlapping_subgroup_shares_members() {
        let mut specs = kv_and_log();
        specs[1].overlapping = true;
        let layout = StickyLayout.layout(&specs, 1, &[0, 1, 2, 3], None).unwrap();
        assert_eq!(layout.shards[1], vec![vec![0, 1]]);
        assert_eq!(layout.shards_of(0).collect::<Vec<_>>(), vec![(0, 0, 0), (1, 0, 0)]);
    }

    #[test]
    fn bad_specifications_are_named() {
        let mut zero = SubgroupSpec::new("kv", 0, 2);
        assert!(StickyLayout
            .layout(&[zero.clone()], 1, &[0, 1], None)
            .unwrap_err()
            .to_string()
            .contains("shards 0"));
        zero.shards = 1;
        zero.name = "a b".into();
        assert!(matches!(
            StickyLayout.layout(&[zero], 1, &[0, 1], None),
            Err(LayoutError::BadSpec { .. })
        ));
        let twice = vec![SubgroupSpec::new("kv", 1, 1), SubgroupSpec::new("kv", 1, 1)];
        assert_eq!(
            StickyLayout.layout(&twice, 1, &[0, 1], None),
            Err(LayoutError::DuplicateName("kv".into()))
        );
        let mut senders = SubgroupSpec::new("kv", 1, 2);
        senders.senders = SenderSet::Ranks(vec![2]);
        assert!(StickyLayout
            .layout(&[senders], 1, &[0, 1], None)
            .unwrap_err()
            .to_string()
            .contains("sender rank 2"));
    }

    #[test]
    fn a_user_function_is_checked() {
        struct AllInOne;
        impl LayoutFunction for AllInOne {
            fn layout(
                &self,
                _: &[SubgroupSpec],
                view_id: u64,
                _: &[usize],
                _: Option<&Layout>,
            ) -> Result<Layout, LayoutError> {
                Ok(Layout {
                    view_id,
                    shards: vec![vec![vec![0, 1], vec![1, 2]]],
                })
            }
        }
        let err = lay_out(&AllInOne, &[SubgroupSpec::new("kv", 2, 2)], 1, &[0, 1, 2], None).unwrap_err();
        assert!(err.to_string().contains("in two shards"), "{err}");
    }

    #[test]
    fn keys_spread_over_shards_the_same_way_everywhere() {
        // Pinned: a change here moves every key of every deployed map.
        let pinned: Vec<usize> = [&b""[..], b"a", b"user:42", b"key-1"]
            .iter()
            .map(|k| shard_of_key(k, 1000))
            .collect();
        assert_eq!(pinned, PINNED_SHARDS_OF_1000);
        for shards in [2usize, 4, 7] {
            let mut per_shard = vec![0u32; shards];
            for k in 0..4000u32 {
                per_shard[shard_of_key(format!("user{k}").as_bytes(), shards)] += 1;
            }
            let fair = 4000 / shards as u32;
            assert!(
                per_shard.iter().all(|n| *n > fair * 8 / 10 && *n < fair * 12 / 10),
                "{per_shard:?}"
            );
        }
        assert_eq!(shard_group_name("store", "kv", 1), "store.kv.1");
    }

    /// `shard_of_key` of "", "a", "user:42" and "key-1" over 1000 shards.
    const PINNED_SHARDS_OF_1000: [usize; 4] = [342, 315, 112, 852];

    proptest! {
        /// Over a run of random view changes: every layout satisfies the
        /// layout invariants, and a member that stays in the view stays
        /// in the shards it was in (its state does not move).
        #[test]
        fn sticky_layouts_keep_survivors_and_satisfy_the_invariants(
            shards in 1usize..4, per_shard in 1usize..4, changes in proptest::collection::vec((0usize..16, any::<bool>()), 1..40)
        ) {
            let specs = vec![SubgroupSpec::new("a", shards, per_shard), SubgroupSpec::new("b", 1, 1)];
            let mut view: Vec<usize> = (0..16).collect();
            let mut previous: Option<Layout> = None;
            for (id, (member, join)) in changes.into_iter().enumerate() {
                if join { if !view.contains(&member) { view.push(member); view.sort_unstable(); } }
                else { view.retain(|m| *m != member); }
                match StickyLayout.layout(&specs, id as u64, &view, previous.as_ref()) {
                    Ok(layout) => {
                        prop_assert!(check_layout(&specs, &view, &layout).is_ok());
                        if let Some(before) = &previous {
                            for m in &view {
                                for (g, s, rank) in before.shards_of(*m) {
                                    prop_assert_eq!(layout.shards[g][s][rank], *m, "member {} left its place in shard {}/{}", m, g, s);
                                }
                            }
                        }
                        previous = Some(layout);
                    }
                    Err(LayoutError::Inadequate { .. }) => {
                        prop_assert!(view.len() < shards * per_shard + 1);
                    }
                    Err(e) => prop_assert!(false, "{}", e),
                }
            }
        }
    }
}
