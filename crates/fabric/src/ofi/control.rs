//! The control row: what a member of an ofi group tells its peers over
//! the control plane (a [`TcpFabric`](crate::tcp::TcpFabric), whose
//! handshake proves the group key) so that they can write into its rows:
//! its endpoint address, the key and address of its registration.
//!
//! ```text
//!  control row, 256 bytes, native-endian u64s (written once per process)
//!  +0   incarnation u64   guard: non-zero once the fields below are written
//!                         (a random number, new for every process)
//!  +8   row_len_bytes u64 must equal the reader's
//!  +16  mr_key u64        the registration's key
//!  +24  rows_base u64     virtual address of its rows (0 if the provider
//!                         addresses registrations by offset)
//!  +32  addr_len u64      1..=ADDR_BYTES_MAX
//!  +40  zero [24]
//!  +64  endpoint address [ADDR_BYTES_MAX], zero-padded
//! ```
//!
//! The owner writes the fields, pushes them, then stores the incarnation
//! with `Release` and pushes it (the fabric contract's guard); a reader
//! `Acquire`-loads the incarnation first.

use std::sync::atomic::Ordering;

use super::endpoint::ADDR_BYTES_MAX;
use crate::tcp::TcpFabric;
use crate::{Fabric, FabricError, PeerSet};

pub const CONTROL_ROW_BYTES: usize = 64 + ADDR_BYTES_MAX;
const INCARNATION: usize = 0;
const ROW_LEN: usize = 8;
const MR_KEY: usize = 16;
const ROWS_BASE: usize = 24;
const ADDR_LEN: usize = 32;
const ADDR: usize = 64;

const _: () = assert!(CONTROL_ROW_BYTES.is_multiple_of(crate::CACHE_LINE_BYTES));
const _: () = assert!(ADDR_BYTES_MAX.is_multiple_of(8));

/// What a member announces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announce {
    pub incarnation: u64,
    pub row_len_bytes: u64,
    pub mr_key: u64,
    pub rows_base: u64,
    pub addr: Vec<u8>,
}

/// Write this member's announcement into its control row (once, before
/// any push of it).
pub fn write_own(control: &TcpFabric, me: &Announce) {
    assert!(me.incarnation != 0, "incarnation 0 means 'not yet'");
    assert!(!me.addr.is_empty() && me.addr.len() <= ADDR_BYTES_MAX);
    let row = control.row(control.member_rank());
    row.u64_at(ROW_LEN).store(me.row_len_bytes, Ordering::Relaxed);
    row.u64_at(MR_KEY).store(me.mr_key, Ordering::Relaxed);
    row.u64_at(ROWS_BASE).store(me.rows_base, Ordering::Relaxed);
    row.u64_at(ADDR_LEN).store(me.addr.len() as u64, Ordering::Relaxed);
    let mut padded = [0u8; ADDR_BYTES_MAX];
    padded[..me.addr.len()].copy_from_slice(&me.addr);
    row.store_atomic(ADDR, &padded);
    // Partner: the Acquire load of INCARNATION in `read_peer`.
    row.u64_at(INCARNATION).store(me.incarnation, Ordering::Release);
}

/// Send this member's announcement to `peers`: fields, then the guard.
pub fn push_own(control: &TcpFabric, peers: PeerSet) -> Result<(), FabricError> {
    control.push(ROW_LEN..CONTROL_ROW_BYTES, peers)?;
    control.push(INCARNATION..INCARNATION + 8, peers)?;
    control.flush();
    Ok(())
}

/// `peer`'s announcement, once it has arrived (`Ok(None)` before);
/// `Err` with the reason if it is unusable.
pub fn read_peer(control: &TcpFabric, peer: usize, row_len_bytes: usize) -> Result<Option<Announce>, String> {
    let row = control.row(peer);
    // Partner: the Release store of INCARNATION in `write_own` (the peer's).
    let incarnation = row.u64_at(INCARNATION).load(Ordering::Acquire);
    if incarnation == 0 {
        return Ok(None);
    }
    let their_len = row.u64_at(ROW_LEN).load(Ordering::Relaxed);
    if their_len != row_len_bytes as u64 {
        return Err(format!(
            "it has rows of {their_len} bytes, this member {row_len_bytes} (the layouts differ)"
        ));
    }
    let addr_len = row.u64_at(ADDR_LEN).load(Ordering::Relaxed) as usize;
    if addr_len == 0 || addr_len > ADDR_BYTES_MAX {
        return Err(format!(
            "it announced an endpoint address of {addr_len} bytes (1..={ADDR_BYTES_MAX})"
        ));
    }
    let mut addr = vec![0u8; ADDR_BYTES_MAX];
    row.copy_atomic(ADDR, &mut addr);
    addr.truncate(addr_len);
    Ok(Some(Announce {
        incarnation,
        row_len_bytes: their_len,
        mr_key: row.u64_at(MR_KEY).load(Ordering::Relaxed),
        rows_base: row.u64_at(ROWS_BASE).load(Ordering::Relaxed),
        addr,
    }))
}
