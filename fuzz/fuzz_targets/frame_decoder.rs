//! Fuzz the tcp frame decoder: arbitrary bytes, split into reads at
//! positions taken from the input, decoded the way the receive thread does.
//! Properties: no panic, every write inside the row, at most a header left
//! unconsumed between reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spindle_fabric::tcp::frame::{Event, FrameDecoder};

const ROW: usize = 4096;

fuzz_target!(|data: &[u8]| {
    // First byte: the read size (1..=256); the rest: the stream.
    let Some((&split, stream)) = data.split_first() else { return };
    let read = split as usize + 1;
    let mut decoder = FrameDecoder::new(ROW);
    let mut carry: Vec<u8> = Vec::new();
    for chunk in stream.chunks(read) {
        let mut buf = std::mem::take(&mut carry);
        buf.extend_from_slice(chunk);
        let mut input = &buf[..];
        loop {
            match decoder.next(&mut input) {
                Ok(Some(Event::Write { offset, bytes, .. })) => {
                    assert!(offset + bytes.len() <= ROW, "write outside the row");
                }
                Ok(Some(Event::Leave)) => {}
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(input.len() <= FrameDecoder::CARRY_MAX);
        carry = input.to_vec();
    }
});
