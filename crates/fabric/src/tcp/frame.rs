//! The tcp fabric's data frames: encoding and a sans-IO streaming decoder.
//!
//! After the handshake ([`super::handshake`]) each direction of a
//! connection carries a stream of frames. A push of bytes `offset..offset +
//! len` of the sender's row becomes one or more `WRITE` frames; a member
//! that closes cleanly sends one `LEAVE` frame last.
//!
//! ```text
//!  frame header, 16 bytes, little-endian
//!  +0  kind     u8    1 = WRITE, 2 = LEAVE
//!  +1  region   u8    0 = the sender's row (the only region in this version)
//!  +2  reserved u16   0
//!  +4  len      u32   payload bytes that follow (WRITE: 1..=FRAME_PAYLOAD_MAX, LEAVE: 0)
//!  +8  offset   u64   where the payload goes in the sender's row (LEAVE: 0)
//!  +16 payload  len bytes
//! ```
//!
//! The decoder validates a header completely (kind, region, reserved,
//! length limit, `offset + len <= row_len_bytes` without overflow) before
//! it hands out a single payload byte, so a bad frame never touches memory.
//! It streams payloads: a frame's bytes are handed out as they arrive,
//! which the ordering contract allows (bytes within one push may appear in
//! any order), but never a part of an 8-byte word when the frame goes on
//! past it: a guard word is applied whole, never torn across two reads.

/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: usize = 16;
/// Largest payload of one frame; a longer push is split into frames.
pub const FRAME_PAYLOAD_MAX: usize = 1 << 20;
/// The only region id in this version: the sender's row.
pub const REGION_ROW: u8 = 0;

const KIND_WRITE: u8 = 1;
const KIND_LEAVE: u8 = 2;

const _: () = assert!(FRAME_PAYLOAD_MAX <= u32::MAX as usize);
const _: () = assert!(FRAME_HEADER_BYTES.is_multiple_of(8));

/// Encode a `WRITE` header for `len` bytes at `offset` of the row.
pub fn encode_write(offset: u64, len: u32) -> [u8; FRAME_HEADER_BYTES] {
    debug_assert!(len as usize <= FRAME_PAYLOAD_MAX && len > 0);
    encode(KIND_WRITE, len, offset)
}

/// Encode the `LEAVE` frame (a clean close).
pub fn encode_leave() -> [u8; FRAME_HEADER_BYTES] {
    encode(KIND_LEAVE, 0, 0)
}

fn encode(kind: u8, len: u32, offset: u64) -> [u8; FRAME_HEADER_BYTES] {
    let mut h = [0u8; FRAME_HEADER_BYTES];
    h[0] = kind;
    h[1] = REGION_ROW;
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8..16].copy_from_slice(&offset.to_le_bytes());
    h
}

/// What is wrong with a frame. The message names the field and value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("unknown region {0} (only region 0, the row, exists)")]
    UnknownRegion(u8),
    #[error("reserved header field is {0}, must be 0")]
    Reserved(u16),
    #[error("frame length {len} is outside 1..={FRAME_PAYLOAD_MAX}")]
    Length { len: u64 },
    #[error("frame writes bytes {offset}..{offset}+{len}, outside the row of {row_len_bytes} bytes")]
    OutOfBounds {
        offset: u64,
        len: u64,
        row_len_bytes: usize,
    },
    #[error("LEAVE frame with length {len} and offset {offset} (both must be 0)")]
    BadLeave { len: u64, offset: u64 },
    #[error("data after the LEAVE frame")]
    AfterLeave,
}

/// One thing the decoder found.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// Bytes to write at `offset` of the peer's row copy. `frame_start`:
    /// the first bytes of a new frame (a new push: order it after every
    /// earlier one).
    Write {
        offset: usize,
        bytes: &'a [u8],
        frame_start: bool,
    },
    /// The peer closed cleanly.
    Leave,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Header,
    Payload {
        offset: usize,
        remaining: usize,
        started: bool,
    },
    Left,
}

/// Streaming frame decoder for one connection. Feed it what arrived with
/// [`FrameDecoder::next`]; it consumes only whole headers and whole words
/// (except at a frame's end), so the caller keeps the unconsumed tail
/// (fewer than [`FrameDecoder::CARRY_MAX`] bytes) and prepends it to the
/// next read.
#[derive(Clone, Debug)]
pub struct FrameDecoder {
    row_len_bytes: usize,
    state: State,
    frames: u64,
}

impl FrameDecoder {
    /// The most bytes a caller may have to keep between reads.
    pub const CARRY_MAX: usize = FRAME_HEADER_BYTES;

    pub fn new(row_len_bytes: usize) -> FrameDecoder {
        FrameDecoder {
            row_len_bytes,
            state: State::Header,
            frames: 0,
        }
    }

    /// Frames whose header was accepted so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Decode the next event from `input`, advancing it past what was
    /// consumed. `Ok(None)`: more input is needed (what is left in
    /// `input` must be kept and presented again, followed by new bytes).
    pub fn next<'a>(&mut self, input: &mut &'a [u8]) -> Result<Option<Event<'a>>, FrameError> {
        match self.state {
            State::Left => {
                if input.is_empty() {
                    Ok(None)
                } else {
                    Err(FrameError::AfterLeave)
                }
            }
            State::Header => {
                if input.len() < FRAME_HEADER_BYTES {
                    return Ok(None);
                }
                let header: &[u8; FRAME_HEADER_BYTES] = input[..FRAME_HEADER_BYTES].try_into().expect("16 bytes");
                let event = self.accept_header(header)?;
                *input = &input[FRAME_HEADER_BYTES..];
                self.frames += 1;
                match event {
                    Some(e) => Ok(Some(e)),
                    None => self.next(input),
                }
            }
            State::Payload {
                offset,
                remaining,
                started,
            } => {
                let available = input.len().min(remaining);
                let take = if available == remaining {
                    remaining
                } else {
                    // Stop at a word boundary of the row: a word is never
                    // applied in two parts (guards must not tear).
                    ((offset + available) & !7).saturating_sub(offset)
                };
                if take == 0 {
                    return Ok(None);
                }
                let (bytes, rest) = input.split_at(take);
                *input = rest;
                self.state = if take == remaining {
                    State::Header
                } else {
                    State::Payload {
                        offset: offset + take,
                        remaining: remaining - take,
                        started: true,
                    }
                };
                Ok(Some(Event::Write {
                    offset,
                    bytes,
                    frame_start: !started,
                }))
            }
        }
    }

    /// Validate a header completely; on success enter its payload.
    fn accept_header(&mut self, h: &[u8; FRAME_HEADER_BYTES]) -> Result<Option<Event<'static>>, FrameError> {
        let kind = h[0];
        let region = h[1];
        let reserved = u16::from_le_bytes([h[2], h[3]]);
        let len = u32::from_le_bytes(h[4..8].try_into().expect("4")) as u64;
        let offset = u64::from_le_bytes(h[8..16].try_into().expect("8"));
        if kind != KIND_WRITE && kind != KIND_LEAVE {
            return Err(FrameError::UnknownKind(kind));
        }
        if region != REGION_ROW {
            return Err(FrameError::UnknownRegion(region));
        }
        if reserved != 0 {
            return Err(FrameError::Reserved(reserved));
        }
        if kind == KIND_LEAVE {
            if len != 0 || offset != 0 {
                return Err(FrameError::BadLeave { len, offset });
            }
            self.state = State::Left;
            return Ok(Some(Event::Leave));
        }
        if len == 0 || len > FRAME_PAYLOAD_MAX as u64 {
            return Err(FrameError::Length { len });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.row_len_bytes as u64 => {}
            _ => {
                return Err(FrameError::OutOfBounds {
                    offset,
                    len,
                    row_len_bytes: self.row_len_bytes,
                })
            }
        }
        // Both fit in usize: end <= row_len_bytes.
        self.state = State::Payload {
            offset: offset as usize,
            remaining: len as usize,
            started: false,
        };
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(offset: u64, bytes: &[u8]) -> Vec<u8> {
        let mut v = encode_write(offset, bytes.len() as u32).to_vec();
        v.extend_from_slice(bytes);
        v
    }

    #[test]
    fn whole_frames_decode_to_their_writes() {
        let mut d = FrameDecoder::new(64);
        let mut stream = frame(8, &[1, 2, 3, 4, 5, 6, 7, 8]);
        stream.extend(encode_leave());
        let mut input = &stream[..];
        assert_eq!(
            d.next(&mut input),
            Ok(Some(Event::Write {
                offset: 8,
                bytes: &[1, 2, 3, 4, 5, 6, 7, 8],
                frame_start: true
            }))
        );
        assert_eq!(d.next(&mut input), Ok(Some(Event::Leave)));
        assert!(input.is_empty());
        assert_eq!(d.next(&mut input), Ok(None));
    }

    #[test]
    fn a_partial_word_is_held_back_until_it_is_whole() {
        let mut d = FrameDecoder::new(64);
        let stream = frame(0, &[9; 16]);
        let mut input = &stream[..16 + 12];
        assert!(matches!(d.next(&mut input), Ok(Some(Event::Write { offset: 0, bytes, .. })) if bytes.len() == 8));
        assert_eq!(input.len(), 4, "half a word stays with the caller");
        assert_eq!(d.next(&mut input), Ok(None));
        let mut rest = &stream[16 + 8..];
        assert!(matches!(
            d.next(&mut rest),
            Ok(Some(Event::Write { offset: 8, frame_start: false, bytes })) if bytes.len() == 8
        ));
    }

    #[test]
    fn bad_headers_are_refused_before_any_byte() {
        let cases: [(Vec<u8>, FrameError); 5] = [
            (encode(7, 8, 0).to_vec(), FrameError::UnknownKind(7)),
            (
                frame(60, &[0; 8]),
                FrameError::OutOfBounds {
                    offset: 60,
                    len: 8,
                    row_len_bytes: 64,
                },
            ),
            (encode(KIND_WRITE, 0, 0).to_vec(), FrameError::Length { len: 0 }),
            (
                encode(KIND_WRITE, 8, u64::MAX - 2).to_vec(),
                FrameError::OutOfBounds {
                    offset: u64::MAX - 2,
                    len: 8,
                    row_len_bytes: 64,
                },
            ),
            (
                encode(KIND_LEAVE, 1, 0).to_vec(),
                FrameError::BadLeave { len: 1, offset: 0 },
            ),
        ];
        for (bytes, expected) in cases {
            let mut d = FrameDecoder::new(64);
            let mut input = &bytes[..];
            assert_eq!(d.next(&mut input), Err(expected));
        }
        let mut h = encode_write(0, 8);
        h[1] = 3;
        assert_eq!(
            FrameDecoder::new(64).next(&mut &h[..]),
            Err(FrameError::UnknownRegion(3))
        );
        h[1] = 0;
        h[2] = 1;
        assert_eq!(FrameDecoder::new(64).next(&mut &h[..]), Err(FrameError::Reserved(1)));
    }
}
