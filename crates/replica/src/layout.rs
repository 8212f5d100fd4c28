//! The replica row on a fabric: control columns plus one log *area* per
//! member.
//!
//! ```text
//!  row of member m (every member has every column)
//!  line 0  ┌ epoch            u64  epoch this member is in (as master or backup)
//!          │ role             u64  0 starting · 1 backup · 2 master · 3 recovering · 4 stopped
//!          │ master_rank      u64  whom this member follows (itself when master)
//!          │ ready_epoch      u64  backup: follows epoch `ready_epoch - 1` with fresh state (0: none)
//!          │ flushed_segments u64  backup: segments of its epoch durable on disk (fsync done)
//!          │ sealed_epoch     u64  backup: `e + 1` once epoch e's log is entirely on disk
//!          │ backup_set       u64  master: bit b set when member b is a backup of `epoch`
//!          └ disk_epoch       u64  at open: what this member's disk holds, 1 + 2·(newest epoch + 1)
//!                                  + sealed (1: nothing; 0: not published yet)
//!  line 1  ┌ stopped          u64  master: `e + 1` once it stopped serving epoch e cleanly
//!          │ snapshot_end     u64  master: log position just past this epoch's SnapshotDone (0: not yet)
//!          │ durable          u64  backup, `Durability::Disk`: log position of its epoch written to its
//!          │                       segment files and fdatasynced (Release after the sync)
//!          └ pad
//!  line 2  ┌ fo_promise       u64  failover (see `failover`): epoch << 8 | rank promised
//!          │ fo_beat          u64  epoch << 40 | seq: a master's heartbeat, a follower's echo of it
//!          │ fo_established   u64  newest epoch established + 1 (0: none)
//!          └ fo_campaign      u64  epoch << 32 | (claimed log epoch + 1); 0: not campaigning
//!                                  (written only by the member's failover driver thread)
//!  line 3  ┌ head[M]          u64  the guards: as master, head[b] = log position complete in area b
//!          │                       (Release after the bytes); in rpc mode a backup's own head[m]
//!          │                       is its reply: positions copied into its own area; with
//!          │                       `Completion::Echo` (tcp) a backup's own head[m] is its echo
//!          │                       (`Completion::Queue`, ofi: nothing; the master's completion
//!          │                       queue says when its writes are in the backups' memory)
//!  after   ┌ counters[C]      u64  appends, flow-control waits, syncs, … (never pushed)
//!  next    ┌ areas            M × segments_max × segment_bytes
//!          │   area b of master m: the log segments m writes one-sided for backup b
//!          │   (rpc mode: the request buffer for b); area m of backup m in rpc mode:
//!          │   m's own copy of the log
//! ```
//!
//! The fabric lets a member write only its own row, so the segments that
//! "live in the backup's memory" are, on shm, an area of the master's row
//! that the backup maps and reads in place: the same pages, outliving the
//! master's process as long as the backup holds its mapping.

use spindle_sst::{BytesColumn, LayoutBuilder, RowLayout, U64Column, U64VectorColumn};

use crate::log::LogGeometry;

pub const ROLE_STARTING: u64 = 0;
pub const ROLE_BACKUP: u64 = 1;
pub const ROLE_MASTER: u64 = 2;
pub const ROLE_RECOVERING: u64 = 3;
/// A master that stopped serving cleanly (its backups sealed and exit).
pub const ROLE_STOPPED: u64 = 4;

/// When a one-sided write counts as complete at a backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// When the push returns (shm: the bytes are in memory the backup
    /// maps). No backup thread is involved.
    Push,
    /// When the backup's fabric reports the bytes applied: a small echo
    /// thread on the backup copies the guard it sees (`head[b]` in its copy
    /// of the master's row) into its own `head[b]` and pushes it back — the
    /// completion an RDMA NIC would give, emulated for fabrics whose push
    /// only hands bytes to the kernel (tcp). It copies no record bytes.
    Echo,
    /// When the fabric reports every write to every backup delivered
    /// ([`spindle_fabric::Fabric::pushes_completed`]): ofi, where
    /// libfabric's completion queue says so (`FI_DELIVERY_COMPLETE`; on an
    /// RDMA NIC the target's NIC acknowledged the bytes into its memory).
    /// No backup thread is involved.
    Queue,
}

impl Completion {
    pub fn as_str(&self) -> &'static str {
        match self {
            Completion::Push => "push",
            Completion::Echo => "echo",
            Completion::Queue => "queue",
        }
    }
}

/// When a write is acknowledged, as far as the backups' disks go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// When every backup has it in memory ([`Completion`]); backups write
    /// to disk in the background, so a total failure (every process or the
    /// power lost at once) loses the writes of the last moments
    /// (`backup::OPEN_SEGMENT_FLUSH_INTERVAL`).
    #[default]
    Memory,
    /// When every backup has it in a segment file and `fdatasync` returned:
    /// each backup's syncer writes what arrived since its last sync and
    /// syncs once for all of it (group commit), then publishes `durable`;
    /// the master waits for every backup's `durable` to pass the write.
    Disk,
}

impl Durability {
    pub fn parse(s: &str) -> Result<Durability, String> {
        match s {
            "memory" => Ok(Durability::Memory),
            "disk" => Ok(Durability::Disk),
            other => Err(format!("durability = \"{other}\": expected \"memory\" or \"disk\"")),
        }
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            Durability::Memory => "memory",
            Durability::Disk => "disk",
        }
    }
}

/// The failover words per row: promise, beat, established, campaign.
pub const FAILOVER_WORDS: usize = 4;
const _: () = assert!(FAILOVER_WORDS * 8 <= 64, "one cache line");

/// Counter ids (index into `counters`).
pub const COUNTER_APPENDS: usize = 0;
pub const COUNTER_FLOW_WAITS: usize = 1;
pub const COUNTER_SEGMENTS_FLUSHED: usize = 2;
pub const COUNTER_RPC_COPIES: usize = 3;
/// `Durability::Disk`: fdatasync rounds of a backup's syncer (each covers
/// every record that arrived since the previous one).
pub const COUNTER_SYNCS: usize = 4;
pub const COUNTER_NAMES: [&str; 5] = ["appends", "flow_waits", "segments_flushed", "rpc_copies", "syncs"];
const _: () = assert!(COUNTER_NAMES.len() == COUNTER_SYNCS + 1, "a name per counter id");

/// Column handles of the replica row.
#[derive(Clone, Debug)]
pub struct ReplicaLayout {
    pub row: RowLayout,
    pub epoch: U64Column,
    pub role: U64Column,
    pub master_rank: U64Column,
    pub ready_epoch: U64Column,
    pub flushed_segments: U64Column,
    pub sealed_epoch: U64Column,
    pub backup_set: U64Column,
    pub disk_epoch: U64Column,
    pub stopped: U64Column,
    pub snapshot_end: U64Column,
    pub durable: U64Column,
    /// The failover words ([`crate::failover::ControlRow`]), in order:
    /// promise, beat, established, campaign.
    pub failover: U64VectorColumn,
    pub head: U64VectorColumn,
    pub counters: U64VectorColumn,
    pub areas: BytesColumn,
    pub geometry: LogGeometry,
    pub members: usize,
    pub completion: Completion,
    pub durability: Durability,
}

impl ReplicaLayout {
    /// The layout for shm (`Completion::Push`).
    pub fn new(members: usize, geometry: LogGeometry, mode: &str) -> ReplicaLayout {
        ReplicaLayout::with_completion(members, geometry, mode, Completion::Push)
    }

    /// The layout with an explicit completion rule (tcp: `Echo`). The rule
    /// is part of the layout tag, so members that disagree fail to join.
    pub fn with_completion(members: usize, geometry: LogGeometry, mode: &str, completion: Completion) -> ReplicaLayout {
        ReplicaLayout::with_durability(members, geometry, mode, completion, Durability::Memory)
    }

    /// The layout with explicit completion and durability rules; both are
    /// part of the layout tag, so members that disagree fail to join.
    pub fn with_durability(
        members: usize,
        geometry: LogGeometry,
        mode: &str,
        completion: Completion,
        durability: Durability,
    ) -> ReplicaLayout {
        assert!(
            (2..=spindle_fabric::MEMBERS_MAX).contains(&members),
            "members {members}"
        );
        let mut b = LayoutBuilder::new(&format!(
            "replica members={members} mode={mode} segment_bytes={} segments={} completion={} durability={} failover=lease",
            geometry.segment_bytes,
            geometry.segments_max,
            completion.as_str(),
            durability.as_str()
        ));
        let epoch = b.u64("epoch");
        let role = b.u64("role");
        let master_rank = b.u64("master_rank");
        let ready_epoch = b.u64("ready_epoch");
        let flushed_segments = b.u64("flushed_segments");
        let sealed_epoch = b.u64("sealed_epoch");
        let backup_set = b.u64("backup_set");
        let disk_epoch = b.u64("disk_epoch");
        b.cache_line_break();
        let stopped = b.u64("stopped");
        let snapshot_end = b.u64("snapshot_end");
        let durable = b.u64("durable");
        b.cache_line_break();
        let failover = b.u64_vector("failover", FAILOVER_WORDS);
        b.cache_line_break();
        let head = b.u64_vector("head", members);
        b.cache_line_break();
        let counters = b.u64_vector("counters", COUNTER_NAMES.len());
        let areas = b.bytes("areas", members * geometry.area_bytes());
        let row = b.build();
        assert!(areas.offset().is_multiple_of(64), "areas are cache-line aligned");
        assert_eq!(
            durable.offset() / 64,
            stopped.offset() / 64,
            "durable shares line 1 with stopped (the diagram)"
        );
        assert!(durable.offset().is_multiple_of(8), "durable is an aligned u64");
        assert!(
            failover.offset(0).is_multiple_of(64),
            "the failover words share one cache line (the diagram)"
        );
        ReplicaLayout {
            row,
            epoch,
            role,
            master_rank,
            ready_epoch,
            flushed_segments,
            sealed_epoch,
            backup_set,
            disk_epoch,
            stopped,
            snapshot_end,
            durable,
            failover,
            head,
            counters,
            areas,
            geometry,
            members,
            completion,
            durability,
        }
    }

    /// Row offset of area `b`'s byte for log `position`.
    pub fn area_offset(&self, b: usize, position: u64) -> usize {
        assert!(b < self.members, "area {b} of {}", self.members);
        self.areas.offset() + b * self.geometry.area_bytes() + self.geometry.area_offset(position)
    }

    /// Row offset of the start of segment `k`'s slot in area `b`.
    pub fn segment_offset(&self, b: usize, k: u64) -> usize {
        self.area_offset(b, k * self.geometry.segment_bytes as u64)
    }
}
