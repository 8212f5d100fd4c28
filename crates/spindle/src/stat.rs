//! The live counters of the groups on this host, read from shared memory
//! without the members' cooperation: what `spindle stat` shows, as a
//! library API so other tools can observe a node.
//!
//! ```no_run
//! for group in spindle::stat::collect(std::path::Path::new("/dev/shm"), None)? {
//!     for member in &group.members {
//!         let delivered = member.row.as_ref().map(|r| r.delivered_num);
//!         println!("{} member {}: {} delivered {:?}", group.group, member.rank, member.state, delivered);
//!     }
//! }
//! # Ok::<(), spindle::stat::StatError>(())
//! ```
//!
//! How it finds the columns: every group file's header stores the row
//! layout's one-line summary (`smc members=3 senders=3 mode=ordered
//! window_slots=1024 slot_payload_max=10240 row_len_bytes=… tag=0x…`).
//! The reader parses the shape out of it, rebuilds the same [`SmcLayout`]
//! the members built, and trusts the offsets only if the rebuilt layout's
//! tag equals the tag in the header (and the row length matches);
//! otherwise the group is listed with its members but its rows are left
//! unread.
//!
//! All loads are `Relaxed`: the counters are independent monotonic cells
//! and the reader draws no conclusion from the order in which it sees
//! them, so one read may show, say, a delivered count from a slightly
//! later pass than the received counts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use spindle_fabric::shm::{group_file_path, validate_group_name, GroupFile};
use spindle_fabric::tcp::stat::{stat_file_path, StatReader};
use spindle_group::counters::{self, COUNTER_NAMES};
use spindle_group::layout::SmcLayout;
use spindle_group::{DeliveryMode, GroupConfig, SenderSet};

/// Why the live counters could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatError {
    /// No group of that name runs on this host.
    #[error("{0}")]
    NoSuchGroup(String),
    /// The group name is invalid.
    #[error(transparent)]
    Fabric(#[from] spindle_fabric::FabricError),
    /// A group or stat file could not be read.
    #[error("{0}")]
    Read(String),
}

/// One group as seen in one refresh: an shm group file, or one tcp
/// member's stat file (that member's view of the group).
#[derive(Clone, Debug, Serialize)]
pub struct GroupStat {
    /// The group's name.
    pub group: String,
    /// "shm" or "tcp".
    pub transport: &'static str,
    /// tcp: whose view this is (the member that wrote the file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view_of: Option<usize>,
    /// tcp: the viewing member's listener, `(handshakes_failed,
    /// handshakes_pending)`: accepted connections that failed the
    /// handshake since it started (strangers, wrong keys, timeouts), and
    /// those in handshake now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handshakes: Option<HandshakeStat>,
    /// The file read.
    pub path: String,
    /// Some member holds the file's live lock.
    pub live: bool,
    /// The layout summary stored in the file's header.
    pub layout: String,
    /// Why the rows were not read (a layout this version does not know).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown_layout: Option<String>,
    /// Senders in the layout (the length of `received_num`).
    pub senders: usize,
    /// Every rank of the group.
    pub members: Vec<MemberStat>,
}

/// A tcp member's handshake counters (see [`GroupStat::handshakes`]).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct HandshakeStat {
    /// Accepted connections that failed the handshake.
    pub handshakes_failed: u64,
    /// Accepted connections in handshake now.
    pub handshakes_pending: u64,
}

/// One member's slot in the header and, when the layout is known, its row.
#[derive(Clone, Debug, Serialize)]
pub struct MemberStat {
    /// The member's rank.
    pub rank: usize,
    /// Its process id (0: unknown, e.g. a tcp peer).
    pub pid: u32,
    /// "empty", "running", "left" or "crashed"; in a tcp member's view,
    /// its peers are "connected", "waiting", "left", "gone" or "fault".
    pub state: String,
    /// When it joined (Unix time, ns; 0: unknown).
    pub joined_unix_ns: u64,
    /// When it left (Unix time, ns; 0: has not).
    pub left_unix_ns: u64,
    /// Its row, when the layout is known.
    #[serde(flatten)]
    pub row: Option<RowStat>,
}

/// The SMC row of one member.
#[derive(Clone, Debug, Serialize)]
pub struct RowStat {
    /// Bumped by the member's progress loop (a still value: a stalled member).
    pub heartbeat: u64,
    /// The member has finished (`finish_together`).
    pub finished: bool,
    /// Every seq below it received.
    pub received_frontier: u64,
    /// Every seq below it delivered (nulls included).
    pub delivered_num: u64,
    /// Slots this member's ring has published (its guard).
    pub published_slots: u64,
    /// Messages received from each sender, by sender index (nulls counted).
    pub received_num: Vec<u64>,
    /// Ring slots of each sender this member no longer needs.
    pub released_slots: Vec<u64>,
    /// Every counter of `spindle_group::counters`, by name.
    pub counters: BTreeMap<String, u64>,
    /// Slots per publish (sender batching), when any were published.
    pub mean_publish_batch_slots: Option<f64>,
    /// Messages per delivery batch (delivery batching).
    pub mean_delivery_batch_msgs: Option<f64>,
    /// Watch mode: delivered data messages per second since the last refresh.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered_msgs_per_s: Option<f64>,
    /// Watch mode: delivered payload bytes per second since the last read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered_bytes_per_s: Option<f64>,
}

impl RowStat {
    /// Counter `id` of `spindle_group::counters` (0 if absent).
    pub fn counter(&self, id: usize) -> u64 {
        self.counters.get(COUNTER_NAMES[id]).copied().unwrap_or(0)
    }
}

/// Every group in `dir` (shm group files, then the stat files of the tcp
/// members on this host), or only `group` (an error naming it if absent).
pub fn collect(dir: &Path, group: Option<&str>) -> Result<Vec<GroupStat>, StatError> {
    let (files, tcp) = match group {
        Some(name) => {
            validate_group_name(name)?;
            let path = group_file_path(dir, name);
            let tcp = StatReader::list(dir, Some(name)).map_err(|e| StatError::Read(e.to_string()))?;
            if !path.exists() && tcp.is_empty() {
                return Err(StatError::NoSuchGroup(format!(
                    "no Spindle group named '{name}' on this host ({} does not exist, and no tcp member of it runs here: no {})",
                    path.display(),
                    stat_file_path(dir, name, 0).display().to_string().replace("@0", "@<id>")
                )));
            }
            let files = if path.exists() {
                vec![GroupFile::open(dir, name).map_err(|e| StatError::Read(format!("group '{name}': {e}")))?]
            } else {
                Vec::new()
            };
            (files, tcp)
        }
        None => (
            GroupFile::list(dir).map_err(|e| StatError::Read(e.to_string()))?,
            StatReader::list(dir, None).map_err(|e| StatError::Read(e.to_string()))?,
        ),
    };
    Ok(files
        .iter()
        .map(read_group)
        .chain(tcp.iter().map(read_tcp_member))
        .collect())
}

/// The shape recovered from a layout summary.
#[derive(Debug, PartialEq)]
struct LayoutShape {
    members: usize,
    senders: usize,
    mode: DeliveryMode,
    window_slots: usize,
    slot_payload_max: usize,
    snapshot_bytes_max: usize,
    row_len_bytes: usize,
    tag: u64,
}

/// Parse `smc members=… senders=… mode=… window_slots=… slot_payload_max=…
/// snapshot_bytes_max=… row_len_bytes=… tag=0x…` (the summary of [`SmcLayout`]'s row).
fn parse_layout(description: &str) -> Result<LayoutShape, String> {
    let mut words = description.split_whitespace();
    if words.next() != Some("smc") {
        return Err(format!("not an SMC layout: '{description}'"));
    }
    let fields: BTreeMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
    let get = |key: &str| {
        fields
            .get(key)
            .copied()
            .ok_or_else(|| format!("no '{key}=' in '{description}'"))
    };
    let number = |key: &str| {
        get(key)?
            .parse::<usize>()
            .map_err(|e| format!("bad '{key}' in '{description}': {e}"))
    };
    let tag_text = get("tag")?;
    let tag = u64::from_str_radix(tag_text.trim_start_matches("0x"), 16)
        .map_err(|e| format!("bad 'tag' in '{description}': {e}"))?;
    Ok(LayoutShape {
        members: number("members")?,
        senders: number("senders")?,
        mode: DeliveryMode::parse(get("mode")?)?,
        window_slots: number("window_slots")?,
        slot_payload_max: number("slot_payload_max")?,
        snapshot_bytes_max: number("snapshot_bytes_max")?,
        row_len_bytes: number("row_len_bytes")?,
        tag,
    })
}

/// Rebuild the members' row layout from the file's header, and check it
/// against the header's tag and row length before trusting its offsets.
fn recover_layout(file: &GroupFile) -> Result<SmcLayout, String> {
    let header = file.header();
    recover_layout_from(
        &file.group,
        &file.layout_description(),
        file.member_count(),
        header.layout_tag.load(Ordering::Relaxed),
        header.row_len_bytes.load(Ordering::Relaxed) as usize,
    )
}

/// As [`recover_layout`], from the fields of any header (shm or tcp).
fn recover_layout_from(
    group: &str,
    description: &str,
    member_count: usize,
    header_tag: u64,
    header_row_len: usize,
) -> Result<SmcLayout, String> {
    let shape = parse_layout(description)?;
    if shape.members != member_count || member_count > spindle_fabric::MEMBERS_MAX {
        return Err(format!(
            "the header says {member_count} members, the layout {}",
            shape.members
        ));
    }
    if shape.senders == 0 || shape.senders > shape.members {
        return Err(format!(
            "{} senders in a group of {} members",
            shape.senders, shape.members
        ));
    }
    let mut config = GroupConfig::new(group, shape.members);
    // Only the number of senders shapes the row, not which ranks send.
    config.senders = SenderSet::Ranks((0..shape.senders).collect());
    config.mode = shape.mode;
    config.window_slots = shape.window_slots;
    config.slot_payload_max = shape.slot_payload_max;
    config.snapshot_bytes_max = shape.snapshot_bytes_max;
    // Bounds the sizes before the layout builder multiplies them.
    config.validate().map_err(|e| e.to_string())?;
    let layout = SmcLayout::new(&config);
    if layout.row.tag() != shape.tag || layout.row.tag() != header_tag {
        return Err(format!(
            "tag {:#x} rebuilt from the description, {:#x} in the description, {header_tag:#x} in the header",
            layout.row.tag(),
            shape.tag
        ));
    }
    if layout.row.row_len_bytes() != header_row_len || shape.row_len_bytes != header_row_len {
        return Err(format!(
            "rows of {} bytes rebuilt, {header_row_len} in the header",
            layout.row.row_len_bytes()
        ));
    }
    assert_eq!(layout.received_num.len(), shape.senders);
    assert_eq!(layout.counters.len(), COUNTER_NAMES.len());
    Ok(layout)
}

fn read_group(file: &GroupFile) -> GroupStat {
    let layout = recover_layout(file);
    let member_count = file.member_count().min(spindle_fabric::MEMBERS_MAX);
    let header = file.header();
    let members = (0..member_count)
        .map(|rank| {
            let slot = &header.members[rank];
            MemberStat {
                rank,
                pid: slot.pid.load(Ordering::Relaxed),
                state: file.member_state(rank).to_string(),
                joined_unix_ns: slot.joined_unix_ns.load(Ordering::Relaxed),
                left_unix_ns: slot.left_unix_ns.load(Ordering::Relaxed),
                row: layout.as_ref().ok().map(|l| read_row(file.row(rank), l)),
            }
        })
        .collect();
    let mut stat = GroupStat::new(
        file.group.clone(),
        "shm",
        &file.path,
        file.live,
        file.layout_description(),
        &layout,
    );
    stat.members = members;
    stat
}

/// One tcp member's stat file: its own row and its copies of its peers'
/// rows, with its view of each connection.
fn read_tcp_member(file: &StatReader) -> GroupStat {
    let header = file.header();
    let member_count = file.member_count().min(spindle_fabric::MEMBERS_MAX);
    let group = file.group();
    let layout = recover_layout_from(
        &group,
        &file.layout_description(),
        member_count,
        header.layout_tag.load(Ordering::Relaxed),
        header.row_len_bytes.load(Ordering::Relaxed) as usize,
    );
    let me = file.rank();
    let members = (0..member_count)
        .map(|rank| MemberStat {
            rank,
            pid: if rank == me {
                header.pid.load(Ordering::Relaxed)
            } else {
                0
            },
            state: match (rank == me, file.live) {
                (true, true) => "running".to_string(),
                (true, false) => "crashed".to_string(),
                (false, _) => file.peer_state(rank).to_string(),
            },
            joined_unix_ns: if rank == me {
                header.started_unix_ns.load(Ordering::Relaxed)
            } else {
                0
            },
            left_unix_ns: 0,
            row: layout.as_ref().ok().map(|l| read_row(file.row(rank), l)),
        })
        .collect();
    let mut stat = GroupStat::new(group, "tcp", &file.path, file.live, file.layout_description(), &layout);
    stat.view_of = Some(me);
    let (handshakes_failed, handshakes_pending) = file.handshakes();
    stat.handshakes = Some(HandshakeStat {
        handshakes_failed,
        handshakes_pending,
    });
    stat.members = members;
    stat
}

impl GroupStat {
    /// A group's stat before its members are read: the file, its layout
    /// summary, and what the recovered layout says (or why it is unknown).
    fn new(
        group: String,
        transport: &'static str,
        path: &Path,
        live: bool,
        layout_description: String,
        layout: &Result<SmcLayout, String>,
    ) -> GroupStat {
        GroupStat {
            group,
            transport,
            view_of: None,
            handshakes: None,
            path: path.display().to_string(),
            live,
            layout: layout_description,
            unknown_layout: layout
                .as_ref()
                .err()
                .map(|e| format!("the group's layout is unknown to this version of spindle ({e})")),
            senders: layout.as_ref().map(|l| l.senders).unwrap_or(0),
            members: Vec::new(),
        }
    }
}

fn read_row(row: spindle_fabric::RowRef<'_>, layout: &SmcLayout) -> RowStat {
    let load = |offset: usize| row.u64_at(offset).load(Ordering::Relaxed);
    let vector =
        |column: &spindle_sst::U64VectorColumn| (0..column.len()).map(|i| load(column.offset(i))).collect::<Vec<u64>>();
    let values = vector(&layout.counters);
    let counters: BTreeMap<String, u64> = COUNTER_NAMES
        .iter()
        .zip(&values)
        .map(|(name, v)| (name.to_string(), *v))
        .collect();
    let mean = |total: u64, batches: u64| (batches > 0).then(|| total as f64 / batches as f64);
    RowStat {
        heartbeat: load(layout.heartbeat.offset()),
        finished: load(layout.finished.offset()) != 0,
        received_frontier: load(layout.received_frontier.offset()),
        delivered_num: load(layout.delivered_num.offset()),
        published_slots: load(layout.guard.offset()),
        received_num: vector(&layout.received_num),
        released_slots: vector(&layout.released_slots),
        mean_publish_batch_slots: mean(values[counters::PUBLISH_BATCH_SLOTS], values[counters::PUBLISH_BATCHES]),
        mean_delivery_batch_msgs: mean(values[counters::DELIVERED_MSGS], values[counters::DELIVERY_BATCHES]),
        counters,
        delivered_msgs_per_s: None,
        delivered_bytes_per_s: None,
    }
}

/// Fill in delivery rates from the previous refresh, for members that are
/// the same process as then (same group, rank and pid; counters not reset).
pub fn add_rates(groups: &mut [GroupStat], previous: &[GroupStat], elapsed: Duration) {
    let seconds = elapsed.as_secs_f64();
    if seconds <= 0.0 {
        return;
    }
    for group in groups.iter_mut() {
        let Some(prev_group) = previous.iter().find(|g| g.group == group.group && g.path == group.path) else {
            continue;
        };
        for member in group.members.iter_mut() {
            let Some(prev) = prev_group
                .members
                .iter()
                .find(|m| m.rank == member.rank && m.pid == member.pid)
            else {
                continue;
            };
            let (Some(row), Some(prev_row)) = (member.row.as_mut(), prev.row.as_ref()) else {
                continue;
            };
            let rate = |id: usize| {
                row.counter(id)
                    .checked_sub(prev_row.counter(id))
                    .map(|d| d as f64 / seconds)
            };
            let (msgs, bytes) = (rate(counters::DELIVERED_MSGS), rate(counters::DELIVERED_BYTES));
            row.delivered_msgs_per_s = msgs;
            row.delivered_bytes_per_s = bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_summary_round_trips_through_the_parser() {
        let mut config = GroupConfig::new("parse", 5);
        config.senders = SenderSet::Ranks(vec![1, 3, 4]);
        config.mode = DeliveryMode::Unordered;
        config.window_slots = 64;
        config.slot_payload_max = 100;
        let layout = SmcLayout::new(&config);
        let shape = parse_layout(&layout.row.summary()).expect("parse");
        assert_eq!(
            shape,
            LayoutShape {
                members: 5,
                senders: 3,
                mode: DeliveryMode::Unordered,
                window_slots: 64,
                slot_payload_max: 100,
                snapshot_bytes_max: spindle_group::config::defaults::SNAPSHOT_BYTES_MAX,
                row_len_bytes: layout.row.row_len_bytes(),
                tag: layout.row.tag(),
            }
        );
        // The sender ranks do not shape the row: the first ranks rebuild it.
        let mut rebuilt = config.clone();
        rebuilt.senders = SenderSet::Ranks(vec![0, 1, 2]);
        assert_eq!(SmcLayout::new(&rebuilt).row.tag(), layout.row.tag());

        assert!(parse_layout("members=3 row_len_bytes=64 tag=0x1").is_err());
        assert!(parse_layout("smc members=3 senders=x mode=ordered").is_err());
    }
}
