//! Property-based fuzzing of the tcp fabric's byte decoders (the frame
//! decoder and the handshake), runnable on stable Rust with no extra tool:
//! `cargo test -p spindle-fabric --test tcp_fuzz`. Set `PROPTEST_CASES`
//! for a longer run (scripts/fuzz.sh does). The cargo-fuzz targets in
//! fuzz/ drive the same entry points with libFuzzer where nightly exists.
//!
//! Properties:
//! - decoding never panics, whatever the bytes and however they are split
//!   into reads;
//! - every write it hands out lies inside the row (validated first);
//! - a stream decodes to the same row contents whether it arrives whole or
//!   in pieces (streaming is transparent), and a word is never split;
//! - the handshake accepts only a peer that proves the key.

use proptest::prelude::*;
use spindle_fabric::tcp::frame::{encode_leave, encode_write, Event, FrameDecoder};
use spindle_fabric::tcp::handshake::{ExpectRank, Handshake, Hello, HELLO_BYTES, NONCE_BYTES, REPLY_BYTES};

const ROW: usize = 512;

/// Decode `stream`, delivered in reads of the given sizes, the way the
/// receive thread does (keeping the unconsumed tail). Returns the row and
/// whether the decoder stopped with an error.
fn decode(stream: &[u8], reads: &[usize]) -> (Vec<u8>, bool) {
    let mut row = vec![0u8; ROW];
    let mut d = FrameDecoder::new(ROW);
    let mut carry: Vec<u8> = Vec::new();
    let mut at = 0;
    let mut k = 0;
    while at < stream.len() {
        let n = reads.get(k).copied().unwrap_or(usize::MAX).clamp(1, stream.len() - at);
        k += 1;
        let mut buf = std::mem::take(&mut carry);
        buf.extend_from_slice(&stream[at..at + n]);
        at += n;
        let mut input = &buf[..];
        loop {
            match d.next(&mut input) {
                Ok(Some(Event::Write { offset, bytes, .. })) => {
                    assert!(
                        offset + bytes.len() <= ROW,
                        "write {offset}+{} outside the row",
                        bytes.len()
                    );
                    let end = offset + bytes.len();
                    assert!(!bytes.is_empty(), "progress: a write carries bytes");
                    row[offset..end].copy_from_slice(bytes);
                }
                Ok(Some(Event::Leave)) => {}
                Ok(None) => break,
                Err(_) => return (row, true),
            }
        }
        assert!(
            input.len() <= FrameDecoder::CARRY_MAX,
            "the decoder leaves at most a header"
        );
        carry = input.to_vec();
    }
    (row, false)
}

fn frames() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((0usize..ROW, 1usize..64, any::<u8>()), 0..12).prop_map(|writes| {
        let mut s = Vec::new();
        for (offset, len, byte) in writes {
            let len = len.min(ROW - offset).max(1);
            let offset = offset.min(ROW - len);
            s.extend_from_slice(&encode_write(offset as u64, len as u32));
            s.extend(std::iter::repeat_n(byte, len));
        }
        s.extend_from_slice(&encode_leave());
        s
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_or_escape_the_row(
        bytes in prop::collection::vec(any::<u8>(), 0..2048),
        reads in prop::collection::vec(1usize..64, 0..64),
    ) {
        let _ = decode(&bytes, &reads);
    }

    #[test]
    fn mutated_valid_streams_never_escape_the_row(
        stream in frames(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        reads in prop::collection::vec(1usize..40, 0..64),
    ) {
        let mut stream = stream;
        for (i, b) in flips {
            let i = i.index(stream.len());
            stream[i] = b;
        }
        let _ = decode(&stream, &reads);
    }

    #[test]
    fn valid_streams_decode_the_same_whole_or_in_pieces(
        stream in frames(),
        reads in prop::collection::vec(1usize..40, 0..200),
    ) {
        let (whole, e1) = decode(&stream, &[]);
        let (pieces, e2) = decode(&stream, &reads);
        prop_assert!(!e1 && !e2, "valid frames are accepted");
        prop_assert_eq!(whole, pieces);
    }

    #[test]
    fn handshake_messages_from_a_keyless_peer_are_refused(
        hello in prop::collection::vec(any::<u8>(), HELLO_BYTES..=HELLO_BYTES),
        proof in prop::collection::vec(any::<u8>(), REPLY_BYTES..=REPLY_BYTES),
        verdict in prop::collection::vec(any::<u8>(), REPLY_BYTES..=REPLY_BYTES),
    ) {
        let mine = Hello {
            rank: 0,
            member_count: 2,
            row_len_bytes: ROW as u64,
            layout_tag: 1,
            group: "fuzz".into(),
            nonce: [3; NONCE_BYTES],
        };
        let mut hs = Handshake::new(b"the group key", mine, ExpectRank::Above(0));
        let hello: [u8; HELLO_BYTES] = hello.try_into().expect("len");
        if hs.on_hello(&hello).is_ok() {
            let proof: [u8; REPLY_BYTES] = proof.try_into().expect("len");
            // Random bytes cannot prove the key (2^-256).
            prop_assert!(hs.on_proof(&proof).is_err());
        }
        let verdict: [u8; REPLY_BYTES] = verdict.try_into().expect("len");
        let _ = hs.on_verdict(&verdict);
    }
}
