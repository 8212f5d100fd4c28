//! `spindle stat`: the groups running on this host and, live, each
//! member's positions and counters, read from shared memory without the
//! members' cooperation.
//!
//! How it finds the columns: every group file's header stores the row
//! layout's one-line summary (`smc members=3 senders=3 mode=ordered
//! window_slots=1024 slot_payload_max=10240 row_len_bytes=… tag=0x…`).
//! `stat` parses the shape out of it, rebuilds the same [`SmcLayout`] the
//! members built, and trusts the offsets only if the rebuilt layout's tag
//! equals the tag in the header (and the row length matches); otherwise
//! the group is listed with its members but its rows are left unread.
//!
//! All loads are `Relaxed`: the counters are independent monotonic cells
//! and `stat` draws no conclusion from the order in which it sees them, so
//! one refresh may show, say, a delivered count from a slightly later pass
//! than the received counts.
//!
//! ```text
//! $ spindle stat
//! group demo  live  /dev/shm/spindle-demo
//!   layout: smc members=3 senders=3 mode=ordered window_slots=1024 …
//!                               member 0   member 1   member 2
//!   pid                            41022      41023      41024
//!   state                        running    running    running
//!   …
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use spindle_fabric::shm::{group_file_path, validate_group_name, GroupFile};
use spindle_fabric::tcp::stat::{stat_file_path, StatReader};
use spindle_group::counters::{self, COUNTER_NAMES};
use spindle_group::layout::SmcLayout;
use spindle_group::{DeliveryMode, GroupConfig, SenderSet};

/// Shortest refresh interval accepted in watch mode.
const INTERVAL_MS_MIN: u64 = 10;
/// ANSI: clear the screen and move the cursor home.
const CLEAR_SCREEN: &str = "\x1b[2J\x1b[H";

#[derive(Args, Debug)]
pub struct StatArgs {
    /// Show only this group (an error if it is not running here).
    #[arg(long)]
    pub group: Option<String>,
    /// Directory of the group files.
    #[arg(long, default_value = "/dev/shm", hide = true)]
    pub dir: PathBuf,
    /// Refresh every --interval-ms until Ctrl-C, with rates.
    #[arg(long)]
    pub watch: bool,
    /// Refresh interval in watch mode.
    #[arg(long, default_value_t = 500)]
    pub interval_ms: u64,
    /// Stop after this many refreshes (watch mode).
    #[arg(long, requires = "watch")]
    pub count: Option<u64>,
    /// Print one JSON document (one per line in watch mode) instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: StatArgs) -> Result<(), String> {
    if args.interval_ms < INTERVAL_MS_MIN {
        return Err(format!(
            "--interval-ms {} is too short: use at least {INTERVAL_MS_MIN}",
            args.interval_ms
        ));
    }
    if args.count == Some(0) {
        return Err("--count 0 would show nothing: use at least 1".into());
    }
    let group = args.group.as_deref();
    if !args.watch {
        let groups = collect(&args.dir, group)?;
        print_refresh(&args, &groups, false)?;
        return Ok(());
    }

    let interval = Duration::from_millis(args.interval_ms);
    let mut previous: Option<(Vec<GroupStat>, Instant)> = None;
    let mut refreshes = 0u64;
    loop {
        let taken = Instant::now();
        match collect(&args.dir, group) {
            Ok(mut groups) => {
                if let Some((prev, prev_taken)) = &previous {
                    add_rates(&mut groups, prev, taken.duration_since(*prev_taken));
                }
                print_refresh(&args, &groups, true)?;
                previous = Some((groups, taken));
            }
            // A watched group that ends is shown as gone, not as an error,
            // once it has been seen (it may come back).
            Err(e) if previous.is_some() && group.is_some() => {
                print_gone(&args, &e)?;
                previous = Some((Vec::new(), taken));
            }
            Err(e) => return Err(e),
        }
        refreshes += 1;
        if args.count.is_some_and(|c| refreshes >= c) {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

fn print_refresh(args: &StatArgs, groups: &[GroupStat], watching: bool) -> Result<(), String> {
    let text = if args.json {
        let doc = render_json(&args.dir, groups);
        let mut text = if watching {
            serde_json::to_string(&doc)
        } else {
            serde_json::to_string_pretty(&doc)
        }
        .map_err(|e| format!("encode JSON: {e}"))?;
        text.push('\n');
        text
    } else if watching {
        format!("{CLEAR_SCREEN}{}", render_table(&args.dir, groups))
    } else {
        render_table(&args.dir, groups)
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("write to stdout: {e}"))
}

fn print_gone(args: &StatArgs, why: &str) -> Result<(), String> {
    if !args.json {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{CLEAR_SCREEN}{why}").map_err(|e| format!("write to stdout: {e}"))?;
    }
    Ok(())
}

/// One group as seen in one refresh: an shm group file, or one tcp
/// member's stat file (that member's view of the group).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct GroupStat {
    pub group: String,
    /// "shm" or "tcp".
    pub transport: &'static str,
    /// tcp: whose view this is (the member that wrote the file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view_of: Option<usize>,
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
    pub members: Vec<MemberStat>,
}

/// One member's slot in the header and, when the layout is known, its row.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct MemberStat {
    pub rank: usize,
    pub pid: u32,
    /// "empty", "running", "left" or "crashed"; in a tcp member's view,
    /// its peers are "connected", "waiting", "left", "gone" or "fault".
    pub state: String,
    pub joined_unix_ns: u64,
    pub left_unix_ns: u64,
    #[serde(flatten)]
    pub row: Option<RowStat>,
}

/// The SMC row of one member.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RowStat {
    pub heartbeat: u64,
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
    pub mean_publish_batch_slots: Option<f64>,
    pub mean_delivery_batch_msgs: Option<f64>,
    /// Watch mode: delivered data messages per second since the last refresh.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered_msgs_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered_bytes_per_s: Option<f64>,
}

impl RowStat {
    fn counter(&self, id: usize) -> u64 {
        self.counters.get(COUNTER_NAMES[id]).copied().unwrap_or(0)
    }
}

/// Every group in `dir` (shm group files, then the stat files of the tcp
/// members on this host), or only `group` (an error naming it if absent).
pub(crate) fn collect(dir: &Path, group: Option<&str>) -> Result<Vec<GroupStat>, String> {
    let (files, tcp) = match group {
        Some(name) => {
            validate_group_name(name).map_err(|e| e.to_string())?;
            let path = group_file_path(dir, name);
            let tcp = StatReader::list(dir, Some(name)).map_err(|e| e.to_string())?;
            if !path.exists() && tcp.is_empty() {
                return Err(format!(
                    "no Spindle group named '{name}' on this host ({} does not exist, and no tcp member of it runs here: no {})",
                    path.display(),
                    stat_file_path(dir, name, 0).display().to_string().replace("@0", "@<id>")
                ));
            }
            let files = if path.exists() {
                vec![GroupFile::open(dir, name).map_err(|e| format!("group '{name}': {e}"))?]
            } else {
                Vec::new()
            };
            (files, tcp)
        }
        None => (
            GroupFile::list(dir).map_err(|e| e.to_string())?,
            StatReader::list(dir, None).map_err(|e| e.to_string())?,
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
    GroupStat {
        group: file.group.clone(),
        transport: "shm",
        view_of: None,
        path: file.path.display().to_string(),
        live: file.live,
        layout: file.layout_description(),
        unknown_layout: layout
            .as_ref()
            .err()
            .map(|e| format!("the group's layout is unknown to this version of spindle ({e})")),
        senders: layout.as_ref().map(|l| l.senders).unwrap_or(0),
        members,
    }
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
    GroupStat {
        group,
        transport: "tcp",
        view_of: Some(me),
        path: file.path.display().to_string(),
        live: file.live,
        layout: file.layout_description(),
        unknown_layout: layout
            .as_ref()
            .err()
            .map(|e| format!("the group's layout is unknown to this version of spindle ({e})")),
        senders: layout.as_ref().map(|l| l.senders).unwrap_or(0),
        members,
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
fn add_rates(groups: &mut [GroupStat], previous: &[GroupStat], elapsed: Duration) {
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

/// One JSON document: the directory and every group, member and counter.
pub(crate) fn render_json(dir: &Path, groups: &[GroupStat]) -> serde_json::Value {
    serde_json::json!({
        "dir": dir.display().to_string(),
        "groups": groups,
    })
}

/// The human table: per group a header, then one column per member.
pub(crate) fn render_table(dir: &Path, groups: &[GroupStat]) -> String {
    if groups.is_empty() {
        return format!("no Spindle groups on this host (looked in {})\n", dir.display());
    }
    let mut out = String::new();
    for (i, group) in groups.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        render_group(&mut out, group);
    }
    out
}

fn render_group(out: &mut String, group: &GroupStat) {
    let liveness = match (group.view_of, group.live) {
        (None, true) => "live".to_string(),
        (None, false) => "stale (no live member)".to_string(),
        (Some(r), true) => format!("tcp, as member {r} sees it, live"),
        (Some(r), false) => format!("tcp, as member {r} saw it, stale (member {r} crashed)"),
    };
    out.push_str(&format!(
        "group {}  {}  {}\n  layout: {}\n",
        group.group, liveness, group.path, group.layout
    ));
    if let Some(why) = &group.unknown_layout {
        out.push_str(&format!("  {why}\n"));
    }
    let members = &group.members;
    let mut table = Table::new(members.iter().map(|m| format!("member {}", m.rank)));
    table.row("pid", members.iter().map(|m| m.pid.to_string()));
    table.row("state", members.iter().map(|m| m.state.clone()));
    if group.unknown_layout.is_none() {
        let rows: Vec<Option<&RowStat>> = members.iter().map(|m| m.row.as_ref()).collect();
        let cell = |f: &dyn Fn(&RowStat) -> String| -> Vec<String> {
            rows.iter().map(|r| r.map(f).unwrap_or_else(|| "-".into())).collect()
        };
        let count = |id: usize| cell(&|r: &RowStat| r.counter(id).to_string());
        let mean = |f: fn(&RowStat) -> Option<f64>| {
            cell(&|r: &RowStat| f(r).map(|m| format!("{m:.1}")).unwrap_or_else(|| "-".into()))
        };
        table.row("heartbeat", cell(&|r| r.heartbeat.to_string()));
        table.row("finished", cell(&|r| if r.finished { "yes" } else { "no" }.into()));
        table.row("sent msgs", count(counters::SENT_MSGS));
        table.row("sent bytes", count(counters::SENT_BYTES));
        table.row("published slots", cell(&|r| r.published_slots.to_string()));
        for s in 0..group.senders {
            table.row(
                &format!("received from sender {s}"),
                cell(&|r| r.received_num.get(s).map_or("-".into(), |v| v.to_string())),
            );
        }
        table.row("received msgs", count(counters::RECEIVED_MSGS));
        table.row("received frontier", cell(&|r| r.received_frontier.to_string()));
        table.row("stable", count(counters::STABLE));
        table.row("delivered msgs", count(counters::DELIVERED_MSGS));
        table.row("delivered bytes", count(counters::DELIVERED_BYTES));
        table.row("delivered position", cell(&|r| r.delivered_num.to_string()));
        table.row("nulls sent", count(counters::NULLS_SENT));
        table.row("null runs", count(counters::NULL_RUNS));
        table.row("publish batches", count(counters::PUBLISH_BATCHES));
        table.row("  mean slots/batch", mean(|r| r.mean_publish_batch_slots));
        table.row("receive batches", count(counters::RECEIVE_BATCHES));
        table.row("delivery batches", count(counters::DELIVERY_BATCHES));
        table.row("  mean msgs/batch", mean(|r| r.mean_delivery_batch_msgs));
        table.row("parks", count(counters::PARKS));
        table.row("yields", count(counters::YIELDS));
        table.row("backpressure", count(counters::BACKPRESSURE));
        table.row("steps", count(counters::STEPS));
        if rows.iter().any(|r| r.is_some_and(|r| r.delivered_msgs_per_s.is_some())) {
            table.row("delivered msgs/s", mean(|r| r.delivered_msgs_per_s));
            table.row("delivered MB/s", mean(|r| r.delivered_bytes_per_s.map(|b| b / 1e6)));
        }
    }
    out.push_str(&table.render("  "));
}

/// A text table: a label column, then right-aligned value columns.
struct Table {
    head: Vec<String>,
    rows: Vec<(String, Vec<String>)>,
}

impl Table {
    fn new(head: impl Iterator<Item = String>) -> Table {
        Table {
            head: head.collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, label: &str, cells: impl IntoIterator<Item = String>) {
        let cells: Vec<String> = cells.into_iter().collect();
        assert_eq!(cells.len(), self.head.len(), "row '{label}' has the wrong width");
        self.rows.push((label.to_string(), cells));
    }

    fn render(&self, indent: &str) -> String {
        let label_width = self.rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..self.head.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r.1[c].chars().count())
                    .chain(std::iter::once(self.head[c].chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |label: &str, cells: &[String]| {
            let mut s = format!("{indent}{label:<label_width$}");
            for (cell, width) in cells.iter().zip(&widths) {
                s.push_str(&format!("  {cell:>width$}"));
            }
            s.push('\n');
            s
        };
        let mut out = line("", &self.head);
        for (label, cells) in &self.rows {
            out.push_str(&line(label, cells));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::sync::Arc;

    use spindle_group::{Group, SendError};

    use super::*;

    const PER_SENDER: u64 = 5;
    const PAYLOAD_BYTES: usize = 24;

    /// One shm member: see [`run_member`].
    fn member(config: GroupConfig, rank: usize, done: Arc<AtomicUsize>, stop: Arc<AtomicBool>) {
        run_member(Group::join_shm(config, rank).expect("join"), rank, done, stop);
    }

    /// A tcp member (rows in a stat file in `stat_dir`): see [`run_member`].
    fn tcp_member(
        config: GroupConfig,
        rank: usize,
        options: spindle_fabric::tcp::TcpOptions,
        listener: std::net::TcpListener,
        done: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
    ) {
        let fabric = spindle_fabric::tcp::TcpFabric::open_with_listener(&options, rank, listener).expect("open");
        run_member(Group::join(Arc::new(fabric), config).expect("join"), rank, done, stop);
    }

    /// Send PER_SENDER messages, deliver everyone's, say so, then keep the
    /// protocol running until told to finish.
    fn run_member<F: spindle_fabric::Fabric>(
        mut group: Group<F>,
        rank: usize,
        done: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
    ) {
        let total = PER_SENDER * group.config().members as u64;
        let sender = group.sender().expect("every member sends");
        let (mut sent, mut delivered) = (0u64, 0u64);
        let mut announced = false;
        while !stop.load(Ordering::Acquire) {
            while sent < PER_SENDER {
                match sender.send(&[rank as u8 + 1; PAYLOAD_BYTES]) {
                    Ok(()) => sent += 1,
                    Err(SendError::WouldBlock) => break,
                    Err(e) => panic!("send: {e}"),
                }
            }
            group.poll_or_idle(&mut |_| delivered += 1).expect("poll");
            if delivered >= total && !announced {
                announced = true;
                done.fetch_add(1, Ordering::AcqRel);
            }
        }
        assert_eq!(delivered, total);
        group.finish(&mut |_| {}, Duration::from_secs(30)).expect("finish");
    }

    #[test]
    fn stat_lists_each_tcp_member_with_its_view_of_the_group() {
        let dir = tempfile::tempdir().expect("temporary stat directory");
        let name = format!("stat-tcp-{}", std::process::id());
        let mut config = GroupConfig::new(&name, 2);
        config.window_slots = 16;
        config.slot_payload_max = 64;
        let layout = SmcLayout::new(&config);
        let listeners: Vec<std::net::TcpListener> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
            .collect();
        let addresses = listeners.iter().map(|l| l.local_addr().expect("addr")).collect();
        let mut options = spindle_fabric::tcp::TcpOptions::new(
            &name,
            layout.row.row_len_bytes(),
            layout.row.tag(),
            addresses,
            b"stat test key".to_vec(),
        );
        options.stat_dir = Some(dir.path().to_path_buf());
        options.layout_description = layout.row.summary();
        let done = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let (config, options, done, stop) = (config.clone(), options.clone(), done.clone(), stop.clone());
                std::thread::spawn(move || tcp_member(config, rank, options, l, done, stop))
            })
            .collect();
        let started = Instant::now();
        while done.load(Ordering::Acquire) < 2 && !threads.iter().any(|t| t.is_finished()) {
            assert!(started.elapsed() < Duration::from_secs(60), "members stalled");
            std::thread::sleep(Duration::from_millis(5));
        }
        let snapshot = collect(dir.path(), Some(&name));
        let everything = collect(dir.path(), None);
        stop.store(true, Ordering::Release);
        for t in threads {
            t.join().expect("member thread");
        }
        let groups = snapshot.expect("collect");
        assert_eq!(groups.len(), 2, "one view per tcp member");
        assert_eq!(everything.expect("collect all").len(), 2);
        for (me, group) in groups.iter().enumerate() {
            assert_eq!((group.transport, group.view_of), ("tcp", Some(me)));
            assert!(group.live);
            assert!(group.unknown_layout.is_none(), "{:?}", group.unknown_layout);
            assert_eq!(group.members.len(), 2);
            for m in &group.members {
                let want = if m.rank == me { "running" } else { "connected" };
                assert_eq!(m.state, want);
                let row = m.row.as_ref().expect("row read");
                // The guard is pushed to the peers (the counters are not).
                assert_eq!(row.published_slots, PER_SENDER, "member {} as {me} sees it", m.rank);
            }
            let own = group.members[me].row.as_ref().expect("own row");
            assert_eq!(own.counter(counters::SENT_MSGS), PER_SENDER);
            assert_eq!(own.counter(counters::DELIVERED_MSGS), 2 * PER_SENDER);
        }
        let table = render_table(dir.path(), &groups);
        assert!(table.contains("tcp, as member 1 sees it, live"), "{table}");
        assert!(table.contains("connected"), "{table}");
        // Closed members leave no stat file behind.
        assert!(collect(dir.path(), Some(&name)).is_err());
    }

    #[test]
    fn stat_reads_a_live_two_member_group() {
        let name = format!("stat-test-{}", std::process::id());
        let mut config = GroupConfig::new(&name, 2);
        config.window_slots = 16;
        config.slot_payload_max = 64;
        let done = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..2)
            .map(|rank| {
                let (config, done, stop) = (config.clone(), done.clone(), stop.clone());
                std::thread::spawn(move || member(config, rank, done, stop))
            })
            .collect();
        // Wait for both to deliver everything; a member that panicked ends
        // its thread early, and the join below reports it.
        while done.load(Ordering::Acquire) < 2 && !threads.iter().any(|t| t.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
        }

        let snapshot = collect(Path::new("/dev/shm"), Some(&name));
        stop.store(true, Ordering::Release);
        for t in threads {
            t.join().expect("member thread");
        }
        let groups = snapshot.expect("collect");

        assert_eq!(groups.len(), 1);
        let group = &groups[0];
        assert_eq!(group.group, name);
        assert!(group.live);
        assert!(group.unknown_layout.is_none(), "{:?}", group.unknown_layout);
        assert_eq!(group.senders, 2);
        assert_eq!(group.members.len(), 2);
        for m in &group.members {
            assert_eq!(m.state, "running");
            assert_eq!(m.pid, std::process::id());
            let row = m.row.as_ref().expect("row read");
            assert_eq!(row.counter(counters::SENT_MSGS), PER_SENDER);
            assert_eq!(row.counter(counters::DELIVERED_MSGS), 2 * PER_SENDER);
            assert_eq!(
                row.counter(counters::DELIVERED_BYTES),
                2 * PER_SENDER * PAYLOAD_BYTES as u64
            );
            assert_eq!(row.received_num, vec![PER_SENDER, PER_SENDER]);
            assert!(row.delivered_num >= 2 * PER_SENDER);
        }

        let table = render_table(Path::new("/dev/shm"), &groups);
        assert!(table.contains(&format!("group {name}  live")), "{table}");
        assert!(table.contains("member 1"), "{table}");
        let delivered_line = table
            .lines()
            .find(|l| l.trim_start().starts_with("delivered msgs"))
            .expect("delivered row");
        assert_eq!(
            delivered_line.split_whitespace().collect::<Vec<_>>(),
            ["delivered", "msgs", "10", "10"]
        );
        let sent_line = table
            .lines()
            .find(|l| l.trim_start().starts_with("sent msgs"))
            .expect("sent row");
        assert_eq!(
            sent_line.split_whitespace().collect::<Vec<_>>(),
            ["sent", "msgs", "5", "5"]
        );

        let json = render_json(Path::new("/dev/shm"), &groups);
        let members = json["groups"][0]["members"].as_array().expect("members");
        assert_eq!(members.len(), 2);
        for m in members {
            assert_eq!(m["counters"]["delivered_msgs"], 2 * PER_SENDER);
            assert_eq!(m["counters"]["sent_msgs"], PER_SENDER);
            assert_eq!(m["state"], "running");
        }
    }

    #[test]
    fn watch_rates_come_from_the_previous_refresh_of_the_same_process() {
        let row = |delivered: u64| RowStat {
            heartbeat: 0,
            finished: false,
            received_frontier: 0,
            delivered_num: delivered,
            published_slots: 0,
            received_num: vec![0],
            released_slots: vec![0],
            counters: [("delivered_msgs".to_string(), delivered)].into(),
            mean_publish_batch_slots: None,
            mean_delivery_batch_msgs: None,
            delivered_msgs_per_s: None,
            delivered_bytes_per_s: None,
        };
        let group = |pids: [u32; 2], delivered: u64| GroupStat {
            group: "g".into(),
            transport: "shm",
            view_of: None,
            path: "/dev/shm/spindle-g".into(),
            live: true,
            layout: String::new(),
            unknown_layout: None,
            senders: 1,
            members: (0..2)
                .map(|rank| MemberStat {
                    rank,
                    pid: pids[rank],
                    state: "running".into(),
                    joined_unix_ns: 0,
                    left_unix_ns: 0,
                    row: Some(row(delivered)),
                })
                .collect(),
        };
        let previous = [group([7, 8], 1_000)];
        // Member 1 is a new process (a restart): no rate for it.
        let mut current = [group([7, 9], 3_000)];
        add_rates(&mut current, &previous, Duration::from_millis(500));
        let rate = |m: usize| current[0].members[m].row.as_ref().unwrap().delivered_msgs_per_s;
        assert_eq!(rate(0), Some(4_000.0));
        assert_eq!(rate(1), None);
        let table = render_table(Path::new("/dev/shm"), &current);
        assert!(table.contains("delivered msgs/s"), "{table}");
        assert!(table.contains("4000.0"), "{table}");
    }

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

    #[test]
    fn empty_directory_and_missing_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let groups = collect(dir.path(), None).expect("collect");
        assert!(groups.is_empty());
        assert_eq!(
            render_table(dir.path(), &groups),
            format!("no Spindle groups on this host (looked in {})\n", dir.path().display())
        );
        let e = collect(dir.path(), Some("no-such-group")).expect_err("absent");
        assert!(e.contains("no-such-group"), "{e}");
        assert!(collect(dir.path(), Some("../etc")).is_err());
    }
}
