//! Helpers shared by the replica's integration tests.

use std::net::{SocketAddr, TcpListener};

/// `members` listeners on loopback ports the kernel picks, bound before
/// any member starts (so every address is known), with their addresses in
/// rank order; each member takes its own listener out of the list.
pub fn loopback_listeners(members: usize) -> (Vec<Option<TcpListener>>, Vec<SocketAddr>) {
    (0..members)
        .map(|_| {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
            let addr = l.local_addr().expect("its address");
            (Some(l), addr)
        })
        .unzip()
}
