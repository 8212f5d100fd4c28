//! [`SimEvent`]: one scheduler decision, for traces and digests.

use std::hash::Hasher;

use crate::PeerSet;

/// One decision of the scheduler (or of the simulator above it), for the
/// trace that lets a person replay a failure.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SimEvent {
    Push {
        at_ns: u64,
        push: u64,
        src: usize,
        peers: u64,
        offset: usize,
        len: usize,
        chunks: usize,
    },
    Deliver {
        at_ns: u64,
        push: u64,
        src: usize,
        dst: usize,
        offset: usize,
        len: usize,
    },
    Crash {
        at_ns: u64,
        rank: usize,
        in_push: Option<u64>,
        reached: u64,
    },
    Exit {
        at_ns: u64,
        rank: usize,
    },
    Leave {
        at_ns: u64,
        rank: usize,
    },
    Partition {
        at_ns: u64,
        side: u64,
        hold: bool,
    },
    Heal {
        at_ns: u64,
    },
    LinkBroken {
        at_ns: u64,
        src: usize,
        dst: usize,
    },
    /// Recorded by the simulator: a member's step and the work it did.
    Step {
        at_ns: u64,
        rank: usize,
        now_ns: u64,
        work: u32,
    },
    /// Recorded by the simulator: the application of `rank` sent `count` messages.
    Send {
        at_ns: u64,
        rank: usize,
        first: u64,
        count: u64,
    },
    /// Recorded by the simulator: anything else worth a line.
    Note {
        at_ns: u64,
        text: String,
    },
}

impl std::fmt::Display for SimEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |s: u64| format!("{:?}", PeerSet(s).iter().collect::<Vec<_>>());
        match self {
            SimEvent::Push {
                at_ns,
                push,
                src,
                peers,
                offset,
                len,
                chunks,
            } => write!(
                f,
                "t={at_ns} push#{push} {src}->{} bytes {offset}..{} in {chunks} chunk(s)",
                set(*peers),
                offset + len
            ),
            SimEvent::Deliver {
                at_ns,
                push,
                src,
                dst,
                offset,
                len,
            } => {
                write!(
                    f,
                    "t={at_ns} deliver push#{push} {src}->{dst} bytes {offset}..{}",
                    offset + len
                )
            }
            SimEvent::Crash {
                at_ns,
                rank,
                in_push,
                reached,
            } => match in_push {
                Some(p) => write!(
                    f,
                    "t={at_ns} CRASH member {rank} inside push#{p} (reached {})",
                    set(*reached)
                ),
                None => write!(f, "t={at_ns} CRASH member {rank}"),
            },
            SimEvent::Exit { at_ns, rank } => write!(f, "t={at_ns} member {rank} exited"),
            SimEvent::Leave { at_ns, rank } => write!(f, "t={at_ns} member {rank} left"),
            SimEvent::Partition { at_ns, side, hold } => write!(
                f,
                "t={at_ns} PARTITION {} | rest, traffic {}",
                set(*side),
                if *hold { "held" } else { "dropped" }
            ),
            SimEvent::Heal { at_ns } => write!(f, "t={at_ns} HEAL"),
            SimEvent::LinkBroken { at_ns, src, dst } => write!(f, "t={at_ns} link {src}->{dst} broken"),
            SimEvent::Step {
                at_ns,
                rank,
                now_ns,
                work,
            } => {
                write!(f, "t={at_ns} step member {rank} (its clock {now_ns}) work {work}")
            }
            SimEvent::Send {
                at_ns,
                rank,
                first,
                count,
            } => {
                write!(f, "t={at_ns} member {rank} sends messages {first}..{}", first + count)
            }
            SimEvent::Note { at_ns, text } => write!(f, "t={at_ns} {text}"),
        }
    }
}

/// FNV-1a as a `Hasher`: a digest of the whole event stream that is the
/// same on every run (std's `DefaultHasher` is randomly keyed).
pub(super) struct Fnv(pub(super) u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01B3);
        }
    }
}
