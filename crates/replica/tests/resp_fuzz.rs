//! Fuzz-style property tests of the RESP request parser (bytes from the
//! network): it never panics, never reads past what it was given, and a
//! pipelined stream parses to the same requests however it is split.

use proptest::prelude::*;
use spindle_replica::resp::{parse_request, Limits};

fn encode(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Parse every whole request of `stream`, fed in chunks cut at `cuts`.
fn parse_split(stream: &[u8], cuts: &[usize], limits: &Limits) -> Vec<Vec<Vec<u8>>> {
    let mut fed = 0usize;
    let mut used = 0usize;
    let mut out = Vec::new();
    let mut ranges = Vec::new();
    let mut ends: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    ends.push(stream.len());
    ends.sort_unstable();
    for end in ends {
        fed = fed.max(end);
        while let Some(n) = parse_request(&stream[used..fed], limits, &mut ranges).expect("valid stream") {
            let base = used;
            out.push(
                ranges
                    .iter()
                    .map(|r| stream[base + r.start..base + r.end].to_vec())
                    .collect(),
            );
            used += n;
        }
    }
    assert_eq!(used, stream.len(), "every byte consumed");
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let limits = Limits { args_max: 8, bulk_bytes_max: 64, inline_bytes_max: 128 };
        let mut ranges = Vec::new();
        if let Ok(Some(n)) = parse_request(&bytes, &limits, &mut ranges) {
            prop_assert!(n <= bytes.len());
            prop_assert!(ranges.len() <= limits.args_max);
            prop_assert!(ranges.iter().all(|r| r.end <= n && r.end - r.start <= limits.bulk_bytes_max.max(limits.inline_bytes_max)));
        }
        // Mostly-valid prefixes reach deeper paths.
        let mut framed = b"*3\r\n$".to_vec();
        framed.extend_from_slice(&bytes);
        let _ = parse_request(&framed, &limits, &mut ranges);
    }

    #[test]
    fn pipelined_requests_parse_the_same_however_split(
        requests in prop::collection::vec(prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..5), 1..8),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let limits = Limits::for_values(1024);
        let stream: Vec<u8> = requests.iter().flat_map(|r| encode(r)).collect();
        prop_assert_eq!(parse_split(&stream, &cuts, &limits), requests);
    }
}
