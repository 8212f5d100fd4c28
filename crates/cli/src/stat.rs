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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use spindle::stat::{add_rates, collect, GroupStat, RowStat};
use spindle_group::counters;

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
        let groups = collect(&args.dir, group).map_err(|e| e.to_string())?;
        print_refresh(&args, &groups, false)?;
        return Ok(());
    }

    let interval = Duration::from_millis(args.interval_ms);
    let mut previous: Option<(Vec<GroupStat>, Instant)> = None;
    let mut refreshes = 0u64;
    loop {
        let taken = Instant::now();
        match collect(&args.dir, group).map_err(|e| e.to_string()) {
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
    if let Some(h) = &group.handshakes {
        out.push_str(&format!(
            "  handshakes: {} failed, {} pending\n",
            h.handshakes_failed, h.handshakes_pending
        ));
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
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    use spindle::stat::MemberStat;
    use spindle_group::layout::SmcLayout;
    use spindle_group::GroupConfig;

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
            group
                .poll_or_idle(&mut |_: &spindle_group::Delivery<'_>| delivered += 1)
                .expect("poll");
            if delivered >= total && !announced {
                announced = true;
                done.fetch_add(1, Ordering::AcqRel);
            }
        }
        assert_eq!(delivered, total);
        group
            .finish_together(&mut |_: &spindle_group::Delivery<'_>| {}, Duration::from_secs(30))
            .expect("finish");
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
            handshakes: None,
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
    fn empty_directory_and_missing_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let groups = collect(dir.path(), None).expect("collect");
        assert!(groups.is_empty());
        assert_eq!(
            render_table(dir.path(), &groups),
            format!("no Spindle groups on this host (looked in {})\n", dir.path().display())
        );
        let e = collect(dir.path(), Some("no-such-group")).expect_err("absent");
        assert!(e.to_string().contains("no-such-group"), "{e}");
        assert!(collect(dir.path(), Some("../etc")).is_err());
    }
}
