//! Member processes of one run (`spindle bench`, `demo`, `rt`): spawned
//! together, watched together, and never left behind (dropping the set
//! kills whatever still runs).

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Read the JSON result file that each of `count` members left at
/// `path(rank)`; an error names the member whose file is missing or bad.
pub fn read_results<T: serde::de::DeserializeOwned>(
    count: usize,
    path: impl Fn(usize) -> PathBuf,
) -> Result<Vec<T>, String> {
    (0..count)
        .map(|rank| {
            let path = path(rank);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("member {rank} left no result ({}): {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("member {rank} result: {e}"))
        })
        .collect()
}

/// One child process per member rank, each running this executable.
pub struct MemberProcesses {
    children: Vec<Option<Child>>,
}

impl MemberProcesses {
    /// Spawn `count` children of this executable with `args(rank)`. If one
    /// cannot be spawned, the ones already running are killed.
    pub fn spawn(count: usize, args: impl Fn(usize) -> Vec<String>) -> Result<MemberProcesses, String> {
        let exe = std::env::current_exe().map_err(|e| format!("find own executable: {e}"))?;
        let mut procs = MemberProcesses {
            children: Vec::with_capacity(count),
        };
        for rank in 0..count {
            let child = Command::new(&exe)
                .args(args(rank))
                .spawn()
                .map_err(|e| format!("spawn member {rank}: {e}"))?;
            procs.children.push(Some(child));
        }
        Ok(procs)
    }

    /// Wait until every member has exited. A member that fails stops the
    /// run: the others get `grace` to stop by themselves (they see it gone),
    /// then are killed. `tick` runs every `tick_every` while waiting (a
    /// progress display, say).
    pub fn wait(
        mut self,
        timeout: Duration,
        grace: Duration,
        tick_every: Duration,
        tick: &mut dyn FnMut(),
    ) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Some(failure) = self.reap() {
                self.wait_then_kill(grace);
                return Err(failure);
            }
            if self.children.iter().all(Option::is_none) {
                return Ok(());
            }
            if started.elapsed() > timeout {
                self.kill_all();
                return Err(format!("the run did not finish within {} s", timeout.as_secs()));
            }
            tick();
            std::thread::sleep(tick_every);
        }
    }

    /// Collect the members that exited; the first failure, if any.
    fn reap(&mut self) -> Option<String> {
        let mut failure = None;
        for (rank, slot) in self.children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    *slot = None;
                    if !status.success() {
                        failure = failure.or(Some(format!("member {rank} failed ({status})")));
                    }
                }
                Ok(None) => {}
                Err(e) => failure = failure.or(Some(format!("wait for member {rank}: {e}"))),
            }
        }
        failure
    }

    fn wait_then_kill(&mut self, grace: Duration) {
        let started = Instant::now();
        while self.children.iter().any(Option::is_some) && started.elapsed() < grace {
            self.reap();
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill_all();
    }

    fn kill_all(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for MemberProcesses {
    fn drop(&mut self) {
        self.kill_all();
    }
}
