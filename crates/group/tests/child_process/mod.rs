//! Members as child processes: the test binary started again, running
//! only its `member_process` test, which reads its role from an
//! environment variable (so a test can SIGKILL real member processes).

use std::process::{Child, Command, Stdio};

/// Start this test binary again as a member: it runs only
/// `member_process`, with `role` in the environment variable `env_role`.
pub fn spawn_member(env_role: &str, role: String) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "member_process", "--nocapture", "--test-threads=1"])
        .env(env_role, role)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn a member")
}
