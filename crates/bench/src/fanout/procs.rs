//! `spindle fanout bench --procs`: the same multicast+ack measurement
//! with every member but the origin a separate process attached to one
//! `/dev/shm` domain (`spindle fanout member`, hidden, is what the bench
//! re-executes), next to the thread rows of the same run.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spindle_fanout::{Domain, Layout, Tree, WaitConfig};

use super::probe;

/// `spindle fanout member` (internal): one member process of a
/// `fanout bench --procs` run.
#[derive(clap::Args)]
pub struct MemberArgs {
    /// The domain's name (`/dev/shm/spindle-fanout@NAME`).
    #[arg(long)]
    pub shm: String,
    #[arg(long)]
    pub slot: usize,
    /// The CPU to pin to.
    #[arg(long)]
    pub cpu: usize,
    /// Join the group (else serve as a non-member: a broadcast's relay).
    #[arg(long)]
    pub joins: bool,
}

/// How the bench's processes wait: spin long (the thread rows' setting).
pub fn bench_wait() -> WaitConfig {
    WaitConfig {
        spins: 1 << 20,
        yields: 64,
        park_max: Duration::from_millis(1),
    }
}

/// A non-member of a broadcast is busy elsewhere: it sleeps, and the
/// broadcast interrupts (wakes) it.
pub fn relay_wait() -> WaitConfig {
    WaitConfig {
        spins: 0,
        yields: 0,
        park_max: Duration::from_millis(50),
    }
}

/// Serve `args.slot` until the origin (slot 0) detaches; print the
/// messages delivered.
pub fn member(args: MemberArgs) -> Result<(), String> {
    let _ = probe::pin_to_cpu(args.cpu);
    let domain = Domain::open_shm(&args.shm, bench_wait()).map_err(|e| e.to_string())?;
    let mut port = domain
        .attach(args.slot, |d| {
            std::hint::black_box(d.payload);
        })
        .map_err(|e| e.to_string())?;
    if args.joins {
        port.join().map_err(|e| e.to_string())?;
    } else {
        port.set_wait(relay_wait());
    }
    while domain.state().slot_pid(0) != 0 {
        port.serve(Duration::from_millis(50));
    }
    if args.joins {
        port.leave(Duration::from_secs(1)).map_err(|e| e.to_string())?;
    }
    println!("{}", port.delivered());
    Ok(())
}

/// Member processes killed and reaped if a run fails half-way.
struct Members(Vec<(usize, Child)>);

impl Drop for Members {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Multicast+ack latency of one layout and group size, members as
/// processes: the origin (slot 0) is this process, pinned to its slot's
/// CPU; each other serving slot is a `spindle fanout member` process.
pub fn measure(
    tree: &Tree,
    layout: Layout,
    members: usize,
    warmup: u64,
    iterations: u64,
) -> Result<super::Timed, String> {
    let exe: PathBuf = std::env::current_exe().map_err(|e| format!("the spindle binary: {e}"))?;
    let name = format!("bench-{}-{}-{members}", std::process::id(), layout.name());
    let domain = Domain::create_shm(&name, tree.clone(), layout, bench_wait()).map_err(|e| e.to_string())?;
    let group = super::group_slots(tree.slots(), members);
    let serving: Vec<usize> = if layout.interrupts_non_members() {
        (1..tree.slots()).collect()
    } else {
        group[1..].to_vec()
    };
    // The origin's thread (pinned) attaches before the members start: they
    // serve while its slot is held.
    let origin_cpu = tree.cpu_of_slot(0) as usize;
    let expected = group.iter().fold(0u64, |m, s| m | 1 << s);
    let result = std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<super::Timed, String> {
                let _ = probe::pin_to_cpu(origin_cpu);
                let mut origin = domain.attach(0, |_| {}).map_err(|e| e.to_string())?;
                origin.join().map_err(|e| e.to_string())?;
                let mut children = Members(Vec::new());
                for &slot in &serving {
                    let mut c = Command::new(&exe);
                    c.args(["fanout", "member", "--shm", &name, "--slot", &slot.to_string()])
                        .args(["--cpu", &tree.cpu_of_slot(slot).to_string()])
                        .stdout(Stdio::piped());
                    if group.contains(&slot) {
                        c.arg("--joins");
                    }
                    let child = c.spawn().map_err(|e| format!("spawn {}: {e}", exe.display()))?;
                    children.0.push((slot, child));
                }
                let timed = super::time_multicasts(&domain, &mut origin, expected, warmup, iterations)?;
                origin.leave(Duration::from_secs(1)).map_err(|e| e.to_string())?;
                drop(origin);
                // Wake the members' sleeps: they see the origin gone.
                domain.shutdown();
                check_members(&mut children, &group, timed.multicasts)?;
                Ok(timed)
            })
            .join()
            .map_err(|_| "the origin thread panicked".to_string())?
    });
    drop(domain);
    result
}

/// Wait (at most 10 s) for every member process to exit, and check that
/// each group member delivered every multicast.
fn check_members(children: &mut Members, group: &[usize], multicasts: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    for (slot, c) in &mut children.0 {
        let status = loop {
            if let Some(status) = c.try_wait().map_err(|e| e.to_string())? {
                break status;
            }
            if Instant::now() > deadline {
                return Err(format!("member process of slot {slot} did not exit"));
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let mut out = String::new();
        if let Some(mut stdout) = c.stdout.take() {
            std::io::Read::read_to_string(&mut stdout, &mut out).map_err(|e| e.to_string())?;
        }
        if !status.success() {
            return Err(format!("member process of slot {slot} failed: {status}"));
        }
        let delivered: u64 = out
            .trim()
            .parse()
            .map_err(|_| format!("member process of slot {slot} printed {out:?}"))?;
        if group.contains(slot) && delivered != multicasts {
            return Err(format!("slot {slot} delivered {delivered} of {multicasts} multicasts"));
        }
    }
    Ok(())
}
