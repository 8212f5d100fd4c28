//! Who may be the master: a majority election with a lease that fences
//! the old master (sans-IO: no threads, sleeps or clocks; the runtime and
//! the simulator drive it the same way).
//!
//! Every member publishes four words in its row (the failover columns of
//! [`crate::layout`]) and reads everyone else's:
//!
//! ```text
//!  word         format                      meaning
//!  promise      epoch << 8 | rank           the newest epoch this member has promised, and to whom
//!                                           (it never helps anyone lead an older epoch again)
//!  beat         epoch << 40 | seq           a master: its heartbeat; a follower: the master's heartbeat
//!                                           it saw last (its echo, a lease renewal)
//!  established  epoch + 1 (0: none)         the newest epoch whose first snapshot every backup of it holds
//!                                           (the master's word, copied by its followers)
//!  campaign     epoch << 32 | (data + 1)    a candidate: the epoch it asks for and the newest epoch whose
//!                                           complete log it holds (0: not a candidate)
//! ```
//!
//! **The rules.** Let *majority* be `members / 2 + 1`.
//!
//! - *Lease.* A master sends a heartbeat every `heartbeat_ns` and notes when
//!   (its clock). A follower echoes the heartbeat of the master it promised.
//!   Once a majority (the master included) echoed heartbeat `s`, the master's
//!   lease runs until `sent(s) + lease_ns`. A follower that echoed a heartbeat
//!   grants no vote for `election_ns > lease_ns` after it saw it, so the lease
//!   ends, at the old master, before any majority can elect another
//!   ([`Failover::can_ack`]: no reply, read or write, without a lease).
//! - *Votes.* A member that saw no new heartbeat of its master for
//!   `election_ns` (plus a stagger by rank) campaigns for
//!   `E = 1 + the newest promised epoch it has seen`, claiming the newest epoch
//!   whose complete log it holds. A member grants (promises `E` to the
//!   candidate) once its own timer ran out, if it promised nothing as new as
//!   `E` and the claim is at least the newest epoch it knows as
//!   *established*. One promise per epoch; a majority of promises (the
//!   candidate's own included) elects.
//! - *Established.* A master acknowledges nothing in an epoch until a
//!   majority publishes it as established, and it establishes an epoch only
//!   once every backup of it holds the epoch's first snapshot. Every write
//!   acknowledged in epoch `e` is in every backup of `e`; a later election's
//!   majority contains a member that knows `e` as established, so the winner
//!   claims `e` or newer: it holds every acknowledged write.
//! - *Rolls.* A master that changes its backup set (a backup lost, a spare
//!   added, log cleaning) moves to `e + 1` itself; followers accept a
//!   heartbeat of a newer epoch from its leader (promising it), and the new
//!   epoch must be established again before the master acknowledges.
//!
//! A member whose peer is known dead for certain (shm: its process is
//! gone) may stop waiting for that master's lease, and the dead no longer
//! count in the majority ([`Failover::handle_dead`]): a group of two
//! members on shm fails over. On tcp nothing is certain: only timers count,
//! and a group needs three members to survive the loss of one.

use std::fmt;

/// Largest epoch the packed words hold (`2^24 - 1`): a member refuses to
/// go past it ([`FailoverError::EpochSpace`]).
pub const EPOCH_MAX: u64 = (1 << 24) - 1;
/// Heartbeat sequence numbers wrap into a new epoch (a roll) before this.
pub const SEQ_MAX: u64 = (1 << 40) - 1;
/// Campaign stagger per rank after a certain death (see `stagger_ns`).
pub const STAGGER_CERTAIN_NS: u64 = 1_000_000;
/// Largest group: the backup set is a 64-bit mask, a rank fits in 8 bits.
pub const MEMBERS_MAX: usize = 64;
/// Heartbeats whose send times a master remembers: a lease is renewed
/// only by an echo of one of these.
pub const SENT_RING: usize = 256;

/// Pack a promise word.
pub const fn promise_word(epoch: u64, rank: usize) -> u64 {
    (epoch << 8) | rank as u64
}
/// Unpack a promise word.
pub const fn promise_parts(word: u64) -> (u64, usize) {
    (word >> 8, (word & 0xff) as usize)
}
/// Pack a heartbeat word.
pub const fn beat_word(epoch: u64, seq: u64) -> u64 {
    (epoch << 40) | seq
}
/// Unpack a heartbeat word.
pub const fn beat_parts(word: u64) -> (u64, u64) {
    (word >> 40, word & SEQ_MAX)
}
/// Pack a campaign word (`data`: an epoch, `None`: no log).
pub const fn campaign_word(epoch: u64, data: Option<u64>) -> u64 {
    (epoch << 32)
        | match data {
            Some(d) => d + 1,
            None => 0,
        }
}
/// Unpack a campaign word: `None` when not campaigning.
pub const fn campaign_parts(word: u64) -> Option<(u64, u64)> {
    if word == 0 {
        None
    } else {
        Some((word >> 32, word & 0xffff_ffff))
    }
}

const _: () = assert!(EPOCH_MAX < (1 << 24) && (EPOCH_MAX << 40) >> 40 == EPOCH_MAX);
const _: () = assert!(MEMBERS_MAX <= 256 && SENT_RING.is_power_of_two());
const _: () = assert!(beat_parts(beat_word(EPOCH_MAX, SEQ_MAX)).0 == EPOCH_MAX);
const _: () = assert!(promise_parts(promise_word(EPOCH_MAX, MEMBERS_MAX - 1)).1 == MEMBERS_MAX - 1);

/// The failover words of one member's row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlRow {
    pub promise: u64,
    pub beat: u64,
    /// Epoch + 1; 0: none.
    pub established: u64,
    pub campaign: u64,
}

/// The timers (all on the member's own monotonic clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub heartbeat_ns: u64,
    /// How long a majority's echo of a heartbeat lets the master answer.
    pub lease_ns: u64,
    /// How long a follower waits, after the last heartbeat it saw, before
    /// it campaigns or grants a vote. Longer than `lease_ns` by at least
    /// [`Timing::DRIFT_MARGIN_PERCENT`] and a heartbeat.
    pub election_ns: u64,
}

impl Timing {
    /// How much faster a master's clock may run than a follower's (the
    /// margin `election_ns` keeps over `lease_ns`); real clocks differ by
    /// parts per million.
    pub const DRIFT_MARGIN_PERCENT: u64 = 10;

    /// Heartbeats every `lease / 16` (at least 1 ms), elections after
    /// `lease × 5 / 3`.
    pub fn from_lease_ms(lease_ms: u64) -> Timing {
        let lease_ns = lease_ms * 1_000_000;
        Timing {
            heartbeat_ns: (lease_ns / 16).max(1_000_000),
            lease_ns,
            election_ns: lease_ns * 5 / 3,
        }
    }

    pub fn validate(&self) -> Result<(), FailoverError> {
        let floor = self.lease_ns + self.lease_ns * Self::DRIFT_MARGIN_PERCENT / 100 + self.heartbeat_ns;
        if self.heartbeat_ns == 0 || self.lease_ns < 4 * self.heartbeat_ns || self.election_ns < floor {
            return Err(FailoverError::Timing(*self));
        }
        if self.lease_ns / self.heartbeat_ns >= SENT_RING as u64 {
            return Err(FailoverError::Timing(*self));
        }
        Ok(())
    }
}

/// Bad parameters or an exhausted epoch space.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FailoverError {
    #[error("failover timing {0:?}: need heartbeat > 0, lease ≥ 4 heartbeats (and < {SENT_RING}), election ≥ lease + 10% + a heartbeat")]
    Timing(Timing),
    #[error("{members} members: the failover needs 1..={MEMBERS_MAX}, and rank {rank} must be below it")]
    Members { members: usize, rank: usize },
    #[error("epoch {0} would pass the largest epoch the rows hold ({EPOCH_MAX})")]
    EpochSpace(u64),
    #[error("only a master rolls to a new epoch")]
    NotMaster,
}

/// What this member is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Follows the master it promised (which may be gone).
    Follower,
    /// Asks for `epoch`.
    Candidate { epoch: u64, since_ns: u64 },
    /// Leads `epoch` (answers only while [`Failover::can_ack`]); asks
    /// for a newer epoch while `rolling` (since the given time).
    Master {
        epoch: u64,
        since_ns: u64,
        rolling: Option<(u64, u64)>,
    },
}

/// Why a master gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepDown {
    /// A member leads a newer epoch.
    Superseded { epoch: u64, by: usize },
    /// No majority echoed a heartbeat for `election_ns`: others may elect.
    LeaseLost,
}

impl fmt::Display for StepDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepDown::Superseded { epoch, by } => write!(f, "member {by} leads epoch {epoch}"),
            StepDown::LeaseLost => write!(f, "lost its lease: no majority renewed it"),
        }
    }
}

/// One member's failover state.
#[derive(Clone, Debug)]
pub struct Failover {
    me: usize,
    members: usize,
    timing: Timing,
    role: Role,
    /// The epoch promised and to whom.
    promise: (u64, usize),
    /// Epoch + 1 of the newest epoch known established (0: none).
    established: u64,
    /// The newest epoch whose complete log this member holds.
    data: Option<u64>,
    /// The heartbeat of our master seen last, and when (our clock).
    beat_seen: u64,
    heard_ns: u64,
    /// The promised master is dead for certain.
    master_dead: bool,
    /// Rows seen last (our own slot unused).
    peers: Vec<ControlRow>,
    /// When each peer's echo of our heartbeat last advanced (master).
    echo_heard_ns: Vec<u64>,
    dead: u64,
    // Master state.
    seq: u64,
    sent_ns: [u64; SENT_RING],
    next_beat_ns: u64,
    lease_until_ns: u64,
    /// Epochs this member may no longer campaign in (it granted them).
    campaign_floor: u64,
    step_down: Option<StepDown>,
    now_ns: u64,
}

impl Failover {
    /// A member of a group that starts with `master` leading `epoch`
    /// (every member agrees on both before it starts).
    pub fn new(
        me: usize,
        members: usize,
        timing: Timing,
        epoch: u64,
        master: usize,
        now_ns: u64,
    ) -> Result<Failover, FailoverError> {
        timing.validate()?;
        if members == 0 || members > MEMBERS_MAX || me >= members || master >= members {
            return Err(FailoverError::Members {
                members,
                rank: me.max(master),
            });
        }
        if epoch > EPOCH_MAX {
            return Err(FailoverError::EpochSpace(epoch));
        }
        let mut f = Failover {
            me,
            members,
            timing,
            role: Role::Follower,
            promise: (epoch, master),
            established: 0,
            data: None,
            beat_seen: 0,
            heard_ns: now_ns,
            master_dead: false,
            peers: vec![ControlRow::default(); members],
            echo_heard_ns: vec![now_ns; members],
            dead: 0,
            seq: 0,
            sent_ns: [0; SENT_RING],
            next_beat_ns: now_ns,
            lease_until_ns: 0,
            campaign_floor: 0,
            step_down: None,
            now_ns,
        };
        if master == me {
            f.become_master(epoch, now_ns);
            // Every member agreed on this start: all count as answering.
            f.echo_heard_ns.iter_mut().for_each(|t| *t = now_ns);
        }
        Ok(f)
    }

    /// A majority of the members not known dead for certain. Safe because
    /// such knowledge is never wrong (shm: the process is gone): any two
    /// majorities of sets that hold every live member share a member that
    /// either is live and keeps its promise, or died bound by it.
    pub fn majority(&self) -> usize {
        (self.members - self.dead.count_ones() as usize) / 2 + 1
    }
    pub fn role(&self) -> Role {
        self.role
    }
    pub fn timing(&self) -> Timing {
        self.timing
    }
    /// The epoch promised and the member it was promised to.
    pub fn promised(&self) -> (u64, usize) {
        self.promise
    }
    /// The epoch this member leads, if it is the master.
    pub fn leading(&self) -> Option<u64> {
        match self.role {
            Role::Master { epoch, .. } => Some(epoch),
            _ => None,
        }
    }
    /// Why this member stopped being the master (it stays a follower).
    pub fn stepped_down(&self) -> Option<StepDown> {
        self.step_down
    }
    pub fn established_epoch(&self) -> Option<u64> {
        self.established.checked_sub(1)
    }
    pub fn data_epoch(&self) -> Option<u64> {
        self.data
    }
    pub fn lease_until_ns(&self) -> u64 {
        self.lease_until_ns
    }

    /// This member's row as it should be published now.
    pub fn row(&self) -> ControlRow {
        let beat = match self.role {
            Role::Master { epoch, .. } => beat_word(epoch, self.seq),
            _ => self.beat_seen,
        };
        let campaign = match self.role {
            Role::Candidate { epoch, .. } => campaign_word(epoch, self.data),
            Role::Master {
                rolling: Some((epoch, _)),
                ..
            } => campaign_word(epoch, self.data),
            _ => 0,
        };
        ControlRow {
            promise: promise_word(self.promise.0, self.promise.1),
            beat,
            established: self.established,
            campaign,
        }
    }

    /// The runtime holds the complete log of `epoch` (its first snapshot
    /// included): the claim this member campaigns with.
    pub fn note_data(&mut self, epoch: u64) {
        if self.data.is_none_or(|d| d < epoch) {
            self.data = Some(epoch);
        }
    }

    /// `rank` is dead for certain (its process is gone): it acknowledges
    /// nothing any more, so its lease need not be waited out.
    pub fn handle_dead(&mut self, rank: usize) {
        if rank < self.members && rank != self.me && self.dead & (1 << rank) == 0 {
            self.dead |= 1 << rank;
            if self.promise.1 == rank && !self.master_dead {
                self.master_dead = true;
                // Its lease need not be waited out: the timer runs out now
                // (candidates still stagger by rank, voters grant at once).
                self.heard_ns = self.heard_ns.min(self.now_ns.saturating_sub(self.timing.election_ns));
            }
        }
    }

    /// The master's every backup holds `epoch`'s first snapshot: publish
    /// it as established (answers wait until a majority copied it).
    pub fn establish(&mut self, epoch: u64) {
        if self.leading() == Some(epoch) {
            self.established = self.established.max(epoch + 1);
            self.data = Some(epoch);
        }
    }

    /// The master asks to move to a new epoch (a new backup set): it
    /// campaigns for it while it still leads its epoch, and its followers
    /// promise it without waiting for a timer (it is their master). It
    /// leads the new epoch once a majority promised ([`Failover::leading`]
    /// says so); returns the epoch asked for. Nothing is answered in it
    /// until it is established again.
    pub fn roll(&mut self, now_ns: u64) -> Result<u64, FailoverError> {
        let Role::Master { epoch, since_ns, .. } = self.role else {
            return Err(FailoverError::NotMaster);
        };
        let next = self.newest_promise_seen().max(epoch) + 1;
        if next > EPOCH_MAX {
            return Err(FailoverError::EpochSpace(next));
        }
        self.role = Role::Master {
            epoch,
            since_ns,
            rolling: Some((next, now_ns)),
        };
        self.count_roll_votes(now_ns);
        Ok(next)
    }

    /// The epoch this master asked to move to and not yet leads.
    pub fn rolling_to(&self) -> Option<u64> {
        match self.role {
            Role::Master { rolling, .. } => rolling.map(|(e, _)| e),
            _ => None,
        }
    }

    /// Whether the master may answer a client now: it leads, its lease
    /// holds, and a majority knows its epoch as established.
    pub fn can_ack(&self, now_ns: u64) -> bool {
        let Some(epoch) = self.leading() else { return false };
        if self.rolling_to().is_some() || now_ns >= self.lease_until_ns {
            return false;
        }
        let established = (0..self.members)
            .filter(|r| {
                if *r == self.me {
                    self.established > epoch
                } else {
                    promise_parts(self.peers[*r].promise) == (epoch, self.me) && self.peers[*r].established > epoch
                }
            })
            .count();
        established >= self.majority()
    }

    /// Whether `rank` answered the master lately: it echoed a heartbeat
    /// within `election_ns` (a member that elected this master counts from
    /// its vote). A backup that did not is dropped (the master then rolls).
    pub fn responsive(&self, rank: usize, now_ns: u64) -> bool {
        if rank == self.me {
            return true;
        }
        if self.dead & (1 << rank) != 0 || self.leading().is_none() {
            return false;
        }
        now_ns.saturating_sub(self.echo_heard_ns[rank]) < self.timing.election_ns
    }

    /// Members that promised this master its epoch (itself included).
    pub fn followers(&self) -> Vec<usize> {
        let Some(epoch) = self.leading() else { return Vec::new() };
        (0..self.members)
            .filter(|r| *r == self.me || promise_parts(self.peers[*r].promise) == (epoch, self.me))
            .collect()
    }

    fn become_master(&mut self, epoch: u64, now_ns: u64) {
        let elected = self.leading().is_none();
        self.role = Role::Master {
            epoch,
            since_ns: now_ns,
            rolling: None,
        };
        self.promise = (epoch, self.me);
        self.master_dead = false;
        self.seq = 0;
        self.lease_until_ns = 0;
        self.next_beat_ns = now_ns;
        if elected {
            // Those who promised us count as answering; the others must
            // echo first. A roll keeps what the old epoch's echoes showed.
            for r in 0..self.members {
                let voted = r == self.me || promise_parts(self.peers[r].promise) == (epoch, self.me);
                self.echo_heard_ns[r] = if voted { now_ns } else { 0 };
            }
        }
        self.beat(now_ns);
    }

    fn beat(&mut self, now_ns: u64) {
        self.seq += 1;
        self.sent_ns[self.seq as usize % SENT_RING] = now_ns;
        self.next_beat_ns = now_ns + self.timing.heartbeat_ns;
    }

    /// How much later than rank 0 this member campaigns: two heartbeats
    /// per rank, so that candidates rarely overlap; 1 ms per rank once the
    /// master is dead for certain (the survivors all know at once, and an
    /// overlap costs nothing: the worse candidate votes for the better).
    fn stagger_ns(&self) -> u64 {
        let per_rank = if self.master_dead {
            STAGGER_CERTAIN_NS
        } else {
            2 * self.timing.heartbeat_ns
        };
        self.me as u64 * per_rank
    }

    /// Take the rows read (`rows[r]` for every member; ours is ignored) and
    /// the time, taken **after** the rows were read, and act: echo, grant,
    /// campaign, win, renew the lease, step down.
    pub fn step(&mut self, rows: &[ControlRow], now_ns: u64) {
        assert_eq!(rows.len(), self.members, "one row per member");
        // Time never goes back (a monotonic clock): the lease depends on it.
        let now_ns = now_ns.max(self.now_ns);
        self.now_ns = now_ns;
        for (r, row) in rows.iter().enumerate() {
            if r == self.me {
                continue;
            }
            if self.leading().is_some() {
                let (epoch, seq) = beat_parts(row.beat);
                let (old_epoch, old_seq) = beat_parts(self.peers[r].beat);
                let echoes = Some(epoch) == self.leading() && (epoch, seq) > (old_epoch, old_seq);
                let grants_roll = self.rolling_to().is_some_and(|e| {
                    promise_parts(row.promise) == (e, self.me) && row.promise != self.peers[r].promise
                });
                if echoes || grants_roll {
                    self.echo_heard_ns[r] = now_ns;
                }
            }
            self.peers[r] = *row;
        }
        self.follow_newer_master(now_ns);
        match self.role {
            Role::Master { .. } => self.lead(now_ns),
            Role::Follower => {
                self.echo(now_ns);
                self.vote(now_ns);
                if self.timer_expired(now_ns, self.stagger_ns()) {
                    self.campaign(now_ns);
                }
            }
            Role::Candidate { .. } => {
                if self.master_beats_again() {
                    // Our master was only slow: no one promised us
                    // anything we must keep, so follow it again.
                    self.role = Role::Follower;
                    self.echo(now_ns);
                    return;
                }
                self.vote(now_ns);
                self.count_votes(now_ns);
            }
        }
    }

    /// The master we promised sends new heartbeats in its epoch.
    fn master_beats_again(&self) -> bool {
        let (epoch, master) = self.promise;
        if master == self.me || self.master_dead {
            return false;
        }
        let row = self.peers[master];
        let (beat_epoch, seq) = beat_parts(row.beat);
        beat_epoch == epoch
            && seq > 0
            && row.beat != self.beat_seen
            && promise_parts(row.promise) == (epoch, master)
            && row.campaign == 0
    }

    /// `master` (the one we promised) beats in the epoch we promised.
    fn master_leads_now(&self, master: usize) -> bool {
        let row = self.peers[master];
        let (beat_epoch, seq) = beat_parts(row.beat);
        seq > 0 && beat_epoch == self.promise.0 && promise_parts(row.promise) == (self.promise.0, master)
    }

    fn timer_expired(&self, now_ns: u64, extra_ns: u64) -> bool {
        now_ns.saturating_sub(self.heard_ns) >= self.timing.election_ns + extra_ns
    }

    /// A member leading an epoch newer than our promise: follow it (it was
    /// elected by a majority, or it rolled from the epoch we promised).
    fn follow_newer_master(&mut self, now_ns: u64) {
        let mut best: Option<(u64, usize)> = None;
        // The dead count too: their last rows are facts (a newer epoch
        // existed and may have acknowledged writes we do not hold).
        for (r, row) in self.peers.iter().enumerate() {
            if r == self.me {
                continue;
            }
            let (epoch, seq) = beat_parts(row.beat);
            let leads = seq > 0 && promise_parts(row.promise) == (epoch, r) && row.campaign == 0;
            if leads && epoch > self.promise.0 && best.is_none_or(|(e, _)| epoch > e) {
                best = Some((epoch, r));
            }
        }
        let Some((epoch, master)) = best else { return };
        if let Role::Master { epoch: mine, .. } = self.role {
            // Total order of masters: a newer epoch's master exists.
            debug_assert!(epoch > mine);
            self.step_down = Some(StepDown::Superseded { epoch, by: master });
        }
        self.role = Role::Follower;
        self.promise = (epoch, master);
        self.beat_seen = 0;
        self.master_dead = self.dead & (1 << master) != 0;
        self.heard_ns = if self.master_dead {
            now_ns.saturating_sub(self.timing.election_ns)
        } else {
            now_ns
        };
        self.echo(now_ns);
    }

    /// The newest epoch known established, here or in the last row of a
    /// member that is dead for certain: a majority that shrank by the
    /// dead must not forget what they knew.
    fn established_floor(&self) -> u64 {
        (0..self.members)
            .filter(|r| self.dead & (1 << r) != 0)
            .map(|r| self.peers[r].established)
            .fold(self.established, u64::max)
    }

    /// Whether this member's log is new enough to lead.
    fn may_lead(&self) -> bool {
        self.data.map_or(0, |d| d + 1) >= self.established_floor()
    }

    /// Echo our master's newest heartbeat and copy what it established.
    fn echo(&mut self, now_ns: u64) {
        let (epoch, master) = self.promise;
        if master == self.me {
            return;
        }
        let row = self.peers[master];
        let (beat_epoch, seq) = beat_parts(row.beat);
        if beat_epoch != epoch || promise_parts(row.promise) != (epoch, master) || seq == 0 {
            return;
        }
        if row.beat != self.beat_seen {
            self.beat_seen = row.beat;
            self.heard_ns = now_ns;
        }
        if row.established > self.established && row.established <= epoch + 1 {
            self.established = row.established;
        }
    }

    /// Grant the best campaign we may grant: a newer epoch than we
    /// promised, our timer out, a claim at least what we know established.
    fn vote(&mut self, now_ns: u64) {
        let expired = self.timer_expired(now_ns, 0);
        let mut best: Option<(u64, u64, usize)> = None;
        for (r, row) in self.peers.iter().enumerate() {
            if r == self.me || self.dead & (1 << r) != 0 {
                continue;
            }
            // Before our timer ran out, only our own master's roll.
            let our_masters_roll = r == self.promise.1 && self.master_leads_now(r);
            if !(expired || our_masters_roll) {
                continue;
            }
            let Some((epoch, data)) = campaign_parts(row.campaign) else {
                continue;
            };
            if epoch <= self.promise.0 || data < self.established_floor() {
                continue;
            }
            // The newest log, then the lowest rank (then the newest epoch).
            let key = (data, std::cmp::Reverse(r), epoch);
            if best.is_none_or(|(e, d, br)| key > (d, std::cmp::Reverse(br), e)) {
                best = Some((epoch, data, r));
            }
        }
        let Some((epoch, data, candidate)) = best else { return };
        if let Role::Candidate { .. } = self.role {
            // Candidates compare logs and ranks, not epochs (each would
            // otherwise keep outbidding the other's epoch): the worse one
            // gives its vote to the better one.
            let own = (self.data.map_or(0, |d| d + 1), std::cmp::Reverse(self.me));
            if own >= (data, std::cmp::Reverse(candidate)) {
                return;
            }
        }
        // One promise per epoch: this one is final for `epoch`.
        self.promise = (epoch, candidate);
        self.role = Role::Follower;
        self.campaign_floor = self.campaign_floor.max(epoch);
        self.master_dead = false;
        self.beat_seen = 0;
        self.heard_ns = now_ns;
    }

    fn newest_promise_seen(&self) -> u64 {
        self.peers
            .iter()
            .map(|r| promise_parts(r.promise).0)
            .chain(
                self.peers
                    .iter()
                    .filter_map(|r| campaign_parts(r.campaign).map(|(e, _)| e)),
            )
            .fold(self.promise.0.max(self.campaign_floor), u64::max)
    }

    fn campaign(&mut self, now_ns: u64) {
        let epoch = self.newest_promise_seen() + 1;
        if epoch > EPOCH_MAX || !self.may_lead() {
            // Stays a follower: the group has used up its epochs, or our
            // log misses an established epoch (another must lead).
            return;
        }
        self.role = Role::Candidate {
            epoch,
            since_ns: now_ns,
        };
        if self.majority() == 1 {
            self.win(epoch, now_ns);
        }
    }

    fn count_votes(&mut self, now_ns: u64) {
        let Role::Candidate { epoch, since_ns } = self.role else {
            return;
        };
        if !self.may_lead() {
            self.role = Role::Follower;
            return;
        }
        let votes = 1
            + (0..self.members)
                .filter(|r| *r != self.me && promise_parts(self.peers[*r].promise) == (epoch, self.me))
                .count();
        if votes >= self.majority() {
            self.win(epoch, now_ns);
            return;
        }
        // Lost or split: try again with an epoch past every promise seen
        // (the same epoch when nobody moved: a cut-off member does not
        // burn epochs).
        if now_ns.saturating_sub(since_ns) >= self.timing.election_ns + self.stagger_ns() {
            let next = self.newest_promise_seen() + 1;
            if next <= EPOCH_MAX {
                self.role = Role::Candidate {
                    epoch: next,
                    since_ns: now_ns,
                };
            }
        }
    }

    fn win(&mut self, epoch: u64, now_ns: u64) {
        // No vote for anyone else in this epoch was given (campaign_floor).
        debug_assert!(epoch > self.campaign_floor, "one promise per epoch");
        self.become_master(epoch, now_ns);
        self.step_down = None;
    }

    /// A rolling master moves to its new epoch once a majority promised it;
    /// a roll that got no majority for an election's length asks again
    /// with an epoch past every promise seen.
    fn count_roll_votes(&mut self, now_ns: u64) {
        let Role::Master {
            epoch,
            since_ns,
            rolling: Some((next, asked_ns)),
        } = self.role
        else {
            return;
        };
        let votes = 1
            + (0..self.members)
                .filter(|r| *r != self.me && promise_parts(self.peers[*r].promise) == (next, self.me))
                .count();
        if votes >= self.majority() {
            self.become_master(next, now_ns);
            return;
        }
        if now_ns.saturating_sub(asked_ns) >= self.timing.election_ns {
            let again = self.newest_promise_seen().max(next) + 1;
            if again <= EPOCH_MAX {
                self.role = Role::Master {
                    epoch,
                    since_ns,
                    rolling: Some((again, now_ns)),
                };
            }
        }
    }

    fn lead(&mut self, now_ns: u64) {
        self.count_roll_votes(now_ns);
        let Role::Master { epoch, .. } = self.role else { return };
        // A member dead for certain that had promised a newer epoch to
        // another (or knew one established) no longer counts in the
        // majority, so its promise could not stop our lease: give up.
        let newer = (0..self.members).filter(|r| self.dead & (1 << r) != 0).find_map(|r| {
            let row = self.peers[r];
            let (e, to) = promise_parts(row.promise);
            if e > epoch && to != self.me {
                Some((e, to))
            } else if row.established > epoch + 1 {
                Some((row.established - 1, r))
            } else {
                None
            }
        });
        if let Some((epoch, by)) = newer {
            self.step_down = Some(StepDown::Superseded { epoch, by });
            self.role = Role::Follower;
            self.lease_until_ns = 0;
            self.heard_ns = now_ns;
            self.beat_seen = 0;
            return;
        }
        if now_ns >= self.next_beat_ns {
            if self.seq >= SEQ_MAX {
                // Rolling is the runtime's job (it changes the data path);
                // until then the lease runs out (never a wrapped echo).
                self.next_beat_ns = u64::MAX;
            } else {
                self.beat(now_ns);
            }
        }
        // The newest heartbeat echoed by a majority (ours counts).
        let mut echoed = [0u64; MEMBERS_MAX];
        let mut n = 0;
        for r in 0..self.members {
            let seq = if r == self.me {
                self.seq
            } else {
                let row = &self.peers[r];
                let (e, s) = beat_parts(row.beat);
                if e != epoch || promise_parts(row.promise) != (epoch, self.me) {
                    continue;
                }
                s.min(self.seq)
            };
            echoed[n] = seq;
            n += 1;
        }
        if n >= self.majority() {
            let slice = &mut echoed[..n];
            slice.sort_unstable_by(|a, b| b.cmp(a));
            let seq = slice[self.majority() - 1];
            if seq > 0 && self.seq - seq < SENT_RING as u64 {
                let until = self.sent_ns[seq as usize % SENT_RING] + self.timing.lease_ns;
                self.lease_until_ns = self.lease_until_ns.max(until);
            }
        }
        // No majority for an election's length: others may have elected.
        let Role::Master { since_ns, .. } = self.role else {
            return;
        };
        let renewed_ns = self.lease_until_ns.saturating_sub(self.timing.lease_ns).max(since_ns);
        if now_ns.saturating_sub(renewed_ns) >= self.timing.election_ns {
            self.step_down = Some(StepDown::LeaseLost);
            self.role = Role::Follower;
            self.lease_until_ns = 0;
            self.heard_ns = now_ns;
            self.beat_seen = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn timing() -> Timing {
        Timing::from_lease_ms(160)
    }

    fn group(n: usize) -> Vec<Failover> {
        (0..n)
            .map(|r| Failover::new(r, n, timing(), 0, 0, 0).unwrap())
            .collect()
    }

    /// Everyone sees everyone's row (except the cut links) and steps at `now`.
    fn round(g: &mut [Failover], now: u64, cut: &[(usize, usize)]) {
        let rows: Vec<ControlRow> = g.iter().map(|f| f.row()).collect();
        for (me, f) in g.iter_mut().enumerate() {
            let seen: Vec<ControlRow> = rows
                .iter()
                .enumerate()
                .map(|(r, row)| {
                    if cut.contains(&(me, r)) || cut.contains(&(r, me)) {
                        f.peers[r]
                    } else {
                        *row
                    }
                })
                .collect();
            f.step(&seen, now);
        }
    }

    #[test]
    fn words_round_trip() {
        assert_eq!(promise_parts(promise_word(7, 3)), (7, 3));
        assert_eq!(beat_parts(beat_word(9, 12345)), (9, 12345));
        assert_eq!(campaign_parts(campaign_word(4, Some(2))), Some((4, 3)));
        assert_eq!(campaign_parts(campaign_word(4, None)), Some((4, 0)));
        assert_eq!(campaign_parts(0), None);
    }

    #[test]
    fn bad_timing_and_members_are_refused() {
        let t = Timing {
            heartbeat_ns: MS,
            lease_ns: 100 * MS,
            election_ns: 100 * MS,
        };
        assert!(matches!(Failover::new(0, 3, t, 0, 0, 0), Err(FailoverError::Timing(_))));
        assert!(matches!(
            Failover::new(3, 3, timing(), 0, 0, 0),
            Err(FailoverError::Members { .. })
        ));
        assert!(matches!(
            Failover::new(0, 65, timing(), 0, 0, 0),
            Err(FailoverError::Members { .. })
        ));
    }

    #[test]
    fn the_master_acks_only_with_a_lease_and_an_established_epoch() {
        let mut g = group(3);
        let mut now = 0;
        for _ in 0..5 {
            now += 10 * MS;
            round(&mut g, now, &[]);
        }
        assert!(!g[0].can_ack(now), "not established yet");
        g[0].establish(0);
        for _ in 0..3 {
            now += 10 * MS;
            round(&mut g, now, &[]);
        }
        assert!(g[0].can_ack(now));
        assert_eq!(g[1].established_epoch(), Some(0));
    }

    #[test]
    fn an_isolated_master_stops_before_a_new_one_is_elected() {
        let mut g = group(3);
        g[0].establish(0);
        g[1].note_data(0);
        g[2].note_data(0);
        let mut now = 0;
        for _ in 0..5 {
            now += 10 * MS;
            round(&mut g, now, &[]);
        }
        assert!(g[0].can_ack(now));
        let cut = [(0, 1), (0, 2)];
        let mut last_ack = 0;
        let mut elected = None;
        for _ in 0..200 {
            now += 5 * MS;
            round(&mut g, now, &cut);
            if g[0].can_ack(now) {
                last_ack = now;
            }
            if let Some(r) = (1..3).find(|r| g[*r].leading().is_some()) {
                elected.get_or_insert((r, now));
            }
        }
        let (winner, at) = elected.expect("the majority elects a master");
        assert!(last_ack < at, "old master acked at {last_ack}, new elected at {at}");
        assert_eq!(g[winner].leading(), Some(1));
        assert_eq!(g[0].stepped_down(), Some(StepDown::LeaseLost));
    }

    #[test]
    fn a_backup_cut_from_the_master_cannot_win() {
        let mut g = group(3);
        g[0].establish(0);
        let mut now = 0;
        for _ in 0..300 {
            now += 5 * MS;
            round(&mut g, now, &[(0, 1)]);
            assert!(g[1].leading().is_none(), "the cut backup became master");
        }
        assert!(matches!(g[1].role(), Role::Candidate { .. }));
        assert!(g[0].can_ack(now), "the master keeps its lease through member 2");
        // Healed: the candidate follows again, in the same epoch.
        for _ in 0..5 {
            now += 5 * MS;
            round(&mut g, now, &[]);
        }
        // It campaigned for epoch 1; the master is in 0: it stays out until
        // the master rolls past its campaign.
        let e = g[0].roll(now).unwrap();
        assert_eq!(g[0].rolling_to(), Some(e));
        for _ in 0..5 {
            now += 5 * MS;
            round(&mut g, now, &[]);
        }
        assert_eq!(g[0].leading(), Some(e), "a majority promised the roll");
        g[0].establish(e);
        for _ in 0..5 {
            now += 5 * MS;
            round(&mut g, now, &[]);
        }
        assert!(g[0].can_ack(now), "the rolled epoch is established");
        let (epoch, master) = g[1].promised();
        assert_eq!(master, 0);
        assert!(epoch >= e);
    }

    #[test]
    fn a_candidate_without_the_established_log_is_refused() {
        let mut g = group(3);
        g[0].establish(0);
        g[1].note_data(0);
        let mut now = 0;
        for _ in 0..5 {
            now += 10 * MS;
            round(&mut g, now, &[]);
        }
        // Master dies: member 2 (no log) must not win; member 1 does.
        g[1].handle_dead(0);
        g[2].handle_dead(0);
        let mut winner = None;
        for _ in 0..200 {
            now += 5 * MS;
            let rows: Vec<ControlRow> = g.iter().map(|f| f.row()).collect();
            for f in g[1..].iter_mut() {
                f.step(&rows, now);
            }
            if let Some(r) = (1..3).find(|r| g[*r].leading().is_some()) {
                winner = Some(r);
                break;
            }
        }
        assert_eq!(winner, Some(1));
    }
}
