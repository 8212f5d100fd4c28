//! Fuzz the handshake from the listener's side: arbitrary HELLO, PROOF and
//! verdict bytes from a peer that does not know the key. Properties: no
//! panic, and a peer without the key is never accepted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spindle_fabric::tcp::handshake::{ExpectRank, Handshake, Hello, HELLO_BYTES, NONCE_BYTES, REPLY_BYTES};

fuzz_target!(|data: &[u8]| {
    if data.len() < HELLO_BYTES + 2 * REPLY_BYTES {
        return;
    }
    let hello: [u8; HELLO_BYTES] = data[..HELLO_BYTES].try_into().expect("len");
    let proof: [u8; REPLY_BYTES] = data[HELLO_BYTES..HELLO_BYTES + REPLY_BYTES].try_into().expect("len");
    let verdict: [u8; REPLY_BYTES] = data[HELLO_BYTES + REPLY_BYTES..][..REPLY_BYTES].try_into().expect("len");
    let mine = Hello {
        rank: 0,
        member_count: 3,
        row_len_bytes: 4096,
        layout_tag: 7,
        group: "fuzz".into(),
        nonce: [9; NONCE_BYTES],
    };
    let mut hs = Handshake::new(b"a key the fuzzer does not know", mine, ExpectRank::Above(0));
    if hs.on_hello(&hello).is_ok() {
        assert!(hs.on_proof(&proof).is_err(), "a peer without the key was accepted");
    }
    let _ = hs.on_verdict(&verdict);
});
