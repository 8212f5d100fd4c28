//! Whether a member's process is alive, cheaply enough to ask every
//! millisecond.
//!
//! On shm a member's death is certain: its process is gone. The failover
//! driver asks about its master every tick (1 ms; it was always 1 ms when
//! this was measured) and about everyone every 5 ms, and a backup's main loop asks about its master while it waits, so
//! an idle 4-member service asked about 4,700 times a second. Reading
//! `/proc/PID/stat` costs an `openat`, a `read`, a `statx` and a `close`
//! (with the kernel formatting the whole stat line): on the 2-vCPU VM the
//! failover threads of an idle shm service took 4.5% of a core each, the
//! tcp service's (which never asks) 1.5%.
//!
//! A **pidfd** (`pidfd_open(2)`, Linux 5.3) refers to one process, not to
//! a number that can be reused, and polls readable once that process has
//! terminated (zombie or reaped). So the first question about a pid opens
//! one and keeps it; every later one is a single `poll(2)` with a zero
//! timeout. The table is fixed ([`WATCHES_MAX`]); a pid it cannot hold, a
//! kernel without pidfds, and every process found terminated are asked
//! through `/proc` instead, which says what the pid names now: a pid
//! reused by a new member in the same slot is alive (and the next question
//! opens its own pidfd). A pid reused by an unrelated process reads alive
//! there too, as it did before pidfds; a new pidfd of it then watches that
//! process.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

/// Processes watched at once per process (a group's members, with room for
/// the members of earlier groups in the same process).
pub const WATCHES_MAX: usize = 64;

struct Watch {
    pid: u32,
    fd: OwnedFd,
}

/// The watched processes; `next_victim` is where a full table puts the
/// next one (round robin).
struct Watches {
    slots: [Option<Watch>; WATCHES_MAX],
    next_victim: usize,
}

static WATCHES: Mutex<Watches> = Mutex::new(Watches {
    slots: [const { None }; WATCHES_MAX],
    next_victim: 0,
});

/// What a pidfd said about a pid.
#[derive(Debug, PartialEq, Eq)]
enum Watched {
    Running,
    /// No such process (`pidfd_open` said ESRCH).
    NoSuchProcess,
    /// The watched process terminated, or no pidfd could be had: ask
    /// `/proc`.
    AskProc,
}

/// A process exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    match watched(pid) {
        Watched::Running => true,
        Watched::NoSuchProcess => false,
        Watched::AskProc => process_alive_by_proc(pid),
    }
}

/// The `/proc` answer: the state letter of `/proc/PID/stat`.
pub fn process_alive_by_proc(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

/// `pid` as the kernel's pid type, if it can name one process (0 and
/// anything that reads negative are refused by pidfd_open, and kill(2)
/// would read them as process groups).
fn process_pid(pid: u32) -> Option<i32> {
    i32::try_from(pid).ok().filter(|p| *p > 0)
}

fn watched(pid: u32) -> Watched {
    let Some(pid_i32) = process_pid(pid) else {
        return Watched::NoSuchProcess;
    };
    let mut watches = WATCHES.lock().unwrap_or_else(|p| p.into_inner());
    let held = watches
        .slots
        .iter()
        .position(|w| w.as_ref().is_some_and(|w| w.pid == pid));
    let index = match held {
        Some(i) => i,
        None => {
            let fd = match pidfd_open(pid_i32) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Watched::NoSuchProcess,
                Err(_) => return Watched::AskProc, // ENOSYS, EMFILE, …
            };
            let i = match watches.slots.iter().position(Option::is_none) {
                Some(free) => free,
                None => {
                    let victim = watches.next_victim;
                    watches.next_victim = (victim + 1) % WATCHES_MAX;
                    victim
                }
            };
            watches.slots[i] = Some(Watch { pid, fd });
            i
        }
    };
    let fd = watches.slots[index]
        .as_ref()
        .map(|w| w.fd.as_raw_fd())
        .expect("just found or put");
    let mut poll_fd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a count of 1, a zero timeout: poll only
    // writes `revents` of that one struct.
    let rc = unsafe { libc::poll(&mut poll_fd, 1, 0) };
    if rc == 0 {
        return Watched::Running;
    }
    // Terminated (POLLIN), or poll failed: forget this pidfd, and let /proc
    // say what the pid is now.
    watches.slots[index] = None;
    Watched::AskProc
}

/// A new pidfd of `pid` (close-on-exec, as pidfd_open always makes it).
fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and a flags word (0) and returns a
    // new descriptor or -1; it touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: rc is a descriptor pidfd_open just returned, owned by nothing
    // else.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as i32) })
}

/// Whether the process of `pidfd` terminated, waiting up to `timeout_ms`
/// for it (0: just look). A failed poll (other than a signal) counts as
/// terminated: [`watched`] then asks `/proc`, and a [`ProcessWatch`] drops
/// the pidfd and only sleeps from then on (a poll that keeps failing would
/// otherwise return at once, every time: a spin).
fn terminated(pidfd: &OwnedFd, timeout_ms: i32) -> bool {
    let mut poll_fd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd and a count of 1: poll only writes
    // `revents` of that one struct.
    let rc = unsafe { libc::poll(&mut poll_fd, 1, timeout_ms) };
    if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
        // A signal cut the wait short: the caller's loop looks again soon
        // enough.
        return false;
    }
    rc != 0
}

/// One process watched by a thread of its own (a failover driver watching
/// its master): [`ProcessWatch::wait_exit`] sleeps until the process
/// terminates or the timeout passes, so a death is seen at once instead of
/// at the next poll.
pub struct ProcessWatch {
    pid: u32,
    fd: Option<OwnedFd>,
}

impl ProcessWatch {
    /// Watch `pid` (without a pidfd, e.g. on a kernel before 5.3 or a pid
    /// already gone, [`ProcessWatch::wait_exit`] only sleeps).
    pub fn new(pid: u32) -> ProcessWatch {
        let fd = process_pid(pid).and_then(|p| pidfd_open(p).ok());
        ProcessWatch { pid, fd }
    }

    /// The pid watched.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sleep until the watched process terminates or `timeout` passes;
    /// true when it terminated (once: the watch then only sleeps, so a
    /// loop around it does not spin on a dead process).
    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> bool {
        match &self.fd {
            Some(fd) => {
                let timeout_ms = timeout.as_nanos().div_ceil(1_000_000).clamp(1, i32::MAX as u128) as i32;
                let exited = terminated(fd, timeout_ms);
                if exited {
                    self.fd = None;
                }
                exited
            }
            None => {
                std::thread::sleep(timeout);
                false
            }
        }
    }
}

/// How many processes are watched now (tests).
#[cfg(test)]
fn watched_count() -> usize {
    let watches = WATCHES.lock().unwrap_or_else(|p| p.into_inner());
    watches.slots.iter().filter(|w| w.is_some()).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// The table is one per process: its tests take turns.
    static TABLE_TURN: Mutex<()> = Mutex::new(());

    fn turn() -> std::sync::MutexGuard<'static, ()> {
        TABLE_TURN.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A child that lives until killed (30 s at most).
    fn sleeper() -> std::process::Child {
        Command::new("sleep")
            .arg("30")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn sleep")
    }

    #[test]
    fn a_child_is_alive_until_it_terminates_zombie_or_reaped() {
        let _turn = turn();
        let mut child = sleeper();
        let pid = child.id();
        assert!(process_alive(pid), "a running child is alive");
        assert_eq!(watched(pid), Watched::Running, "and watched by its pidfd");
        assert!(process_alive_by_proc(pid), "/proc agrees");
        child.kill().expect("kill the child");
        // Not reaped yet: a zombie, which is dead for a member (no death
        // certainty may wait for the supervisor to reap).
        let mut seen_dead = false;
        for _ in 0..2_000 {
            if !process_alive(pid) {
                seen_dead = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(seen_dead, "a killed child (a zombie) is not alive");
        assert!(!process_alive_by_proc(pid), "/proc says zombie too");
        child.wait().expect("reap");
        assert!(!process_alive(pid), "a reaped child is not alive");
    }

    #[test]
    fn a_watch_wakes_at_the_death_and_times_out_while_alive() {
        let _turn = turn();
        let mut child = sleeper();
        let mut watch = ProcessWatch::new(child.id());
        assert_eq!(watch.pid(), child.id());
        assert!(
            !watch.wait_exit(std::time::Duration::from_millis(5)),
            "alive: the wait times out"
        );
        let killer = std::thread::spawn({
            let pid = child.id() as i32;
            // SAFETY: SIGKILL to our own child, which is not reaped yet
            // (its pid cannot have been reused).
            move || unsafe { libc::kill(pid, libc::SIGKILL) }
        });
        assert!(
            watch.wait_exit(std::time::Duration::from_secs(20)),
            "killed (a zombie, not reaped): the wait ends with the death"
        );
        assert_eq!(killer.join().expect("killer"), 0);
        assert!(
            !watch.wait_exit(std::time::Duration::from_millis(1)),
            "said once: from then on the watch only sleeps"
        );
        child.wait().expect("reap");
        let mut gone = ProcessWatch::new(child.id());
        assert!(
            !gone.wait_exit(std::time::Duration::from_millis(1)),
            "a pid already gone: no pidfd, the wait only sleeps"
        );
    }

    #[test]
    fn this_process_is_alive_and_impossible_pids_are_not() {
        let _turn = turn();
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(0), "pid 0 is no process (kill would read it as a group)");
        assert!(!process_alive(u32::MAX), "beyond i32: no process");
        assert!(!process_alive(0x3fff_fff0), "above pid_max: no process");
    }

    #[test]
    fn the_table_is_bounded_and_still_answers_past_it() {
        let _turn = turn();
        // More children than the table holds: the table stays at its
        // bound, and every answer is still right (a full table replaces
        // round robin).
        let mut children: Vec<_> = (0..WATCHES_MAX + 4).map(|_| sleeper()).collect();
        for child in &children {
            assert!(process_alive(child.id()));
        }
        assert_eq!(watched_count(), WATCHES_MAX, "a full table, at its bound");
        for child in &children {
            assert!(process_alive(child.id()), "replaced entries still answer");
        }
        for child in &mut children {
            child.kill().expect("kill");
            child.wait().expect("reap");
        }
        for child in &children {
            assert!(!process_alive(child.id()), "every reaped child is dead");
        }
    }
}
