//! `spindle demo --act persistence`: a persistent group (3 member
//! processes on shared memory, each with its own log on disk) multicasts;
//! every member is killed with SIGKILL; all three start again over their
//! logs and replay the history; the act checks that every message any
//! member delivered before the kill is in it, in the same order.
//!
//! The member processes are `spindle persist-member` (hidden): `run` sends
//! and delivers until killed, writing one line per delivery (a `write`
//! each, so the kill loses at most the line of the delivery it interrupted);
//! `check` restarts, writes the replayed history, and finishes with the
//! others.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use spindle_group::{Delivery, DeliveryMode, Group, GroupConfig, SendError};

const MEMBERS: usize = 3;

#[derive(Args, Debug)]
pub struct PersistMemberArgs {
    /// `run` (send and deliver until killed) or `check` (restart, write the
    /// replayed history, finish).
    #[arg(long)]
    pub role: String,
    #[arg(long)]
    pub group: String,
    /// The act's directory: logs in `logs/`, delivery records beside.
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long)]
    pub rank: usize,
    /// Messages per second this member sends (`run`).
    #[arg(long, default_value_t = 20_000)]
    pub rate: u64,
}

fn config(group: &str, dir: &Path) -> GroupConfig {
    let mut c = GroupConfig::new(group, MEMBERS);
    c.mode = DeliveryMode::Persistent;
    c.persist_dir = Some(dir.join("logs"));
    c.slot_payload_max = 64;
    c.join_timeout = Duration::from_secs(20);
    c
}

fn line(d: &Delivery<'_>) -> String {
    let hex: String = d.payload.iter().map(|b| format!("{b:02x}")).collect();
    format!("{} {} {hex}\n", d.view, d.seq)
}

/// One member process of the act.
pub fn run_member(args: PersistMemberArgs) -> Result<(), String> {
    let mut group = Group::join_shm(config(&args.group, &args.dir), args.rank).map_err(|e| e.to_string())?;
    let first_view = group.view().id;
    match args.role.as_str() {
        "run" => {
            let path = args.dir.join(format!("delivered-{}", args.rank));
            let mut out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let failed = std::cell::RefCell::new(None::<String>);
            let mut record = |d: &Delivery<'_>| {
                if let Err(e) = out.write_all(line(d).as_bytes()) {
                    failed.borrow_mut().get_or_insert(e.to_string());
                }
            };
            let sender = group.sender().ok_or("every member sends")?;
            let started = Instant::now();
            let mut sent = 0u64;
            loop {
                let due = started.elapsed().as_nanos() as u64 * args.rate / 1_000_000_000;
                while sent < due {
                    let counter = (sent as u32).to_le_bytes();
                    match sender.send(&[args.rank as u8, counter[0], counter[1], counter[2], counter[3]]) {
                        Ok(()) => sent += 1,
                        Err(SendError::WouldBlock) => break,
                        Err(e) => return Err(e.to_string()),
                    }
                }
                group.poll_or_idle(&mut record).map_err(|e| e.to_string())?;
                if let Some(e) = failed.borrow_mut().take() {
                    return Err(format!("{}: {e}", path.display()));
                }
            }
        }
        "check" => {
            let mut replayed = String::new();
            let mut newer = 0u64;
            let mut record = |d: &Delivery<'_>| {
                if d.view < first_view {
                    replayed.push_str(&line(d));
                } else {
                    newer += 1;
                }
            };
            group
                .finish_together(&mut record, Duration::from_secs(60))
                .map_err(|e| e.to_string())?;
            if newer > 0 {
                return Err(format!("{newer} deliveries in the restarted view, where nobody sent"));
            }
            let path = args.dir.join(format!("replayed-{}", args.rank));
            std::fs::write(&path, replayed).map_err(|e| format!("{}: {e}", path.display()))
        }
        other => Err(format!("--role {other}: expected run or check")),
    }
}

fn spawn(role: &str, group: &str, dir: &Path, rank: usize) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
    Command::new(exe)
        .args([
            "persist-member",
            "--role",
            role,
            "--group",
            group,
            "--rank",
            &rank.to_string(),
            "--dir",
        ])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start member {rank}: {e}"))
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The act (see the module docs).
pub fn demo_act() -> Result<(), String> {
    let dir = crate::tempdir("demo-persistence")?;
    let result = act(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn act(dir: &Path) -> Result<(), String> {
    let group = format!("demo-persist-{}", std::process::id());
    println!();
    println!(
        "Persistence: 3 members in persistent mode (each message delivered once it is in every member's log on disk, {})",
        dir.display()
    );
    let mut members = (0..MEMBERS)
        .map(|r| spawn("run", &group, dir, r))
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        std::thread::sleep(Duration::from_millis(20));
        for (r, c) in members.iter_mut().enumerate() {
            if let Some(status) = c.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("member {r} stopped on its own ({status})"));
            }
        }
    }
    for c in &mut members {
        c.kill().map_err(|e| format!("SIGKILL: {e}"))?;
    }
    for c in &mut members {
        let _ = c.wait();
    }
    let before: Vec<Vec<String>> = (0..MEMBERS)
        .map(|r| lines(&dir.join(format!("delivered-{r}"))))
        .collect();
    println!(
        "  every member killed with SIGKILL (no clean shutdown) after delivering {:?} messages",
        before.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let checks = (0..MEMBERS)
        .map(|r| spawn("check", &group, dir, r))
        .collect::<Result<Vec<_>, _>>()?;
    for (r, c) in checks.into_iter().enumerate() {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "restarted member {r} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    let replayed: Vec<Vec<String>> = (0..MEMBERS)
        .map(|r| lines(&dir.join(format!("replayed-{r}"))))
        .collect();
    if let Some(r) = (1..MEMBERS).find(|r| replayed[*r] != replayed[0]) {
        return Err(format!("members 0 and {r} replayed different histories"));
    }
    let history = &replayed[0];
    println!(
        "  all 3 restarted from their logs and agreed on the history: {} messages, replayed to each in the same order",
        history.len()
    );
    for (r, b) in before.iter().enumerate() {
        if b.len() > history.len() || history[..b.len()] != b[..] {
            let at = b.iter().zip(history).position(|(x, y)| x != y).unwrap_or(history.len());
            return Err(format!(
                "member {r} delivered {} messages before the kill but the history differs at message {at}: a delivered message was lost",
                b.len()
            ));
        }
    }
    println!(
        "OK: nothing delivered before the kill was lost ({} of {} delivered at the most advanced member; the rest were on disk, not yet delivered)",
        before.iter().map(Vec::len).max().unwrap_or(0),
        history.len()
    );
    Ok(())
}
