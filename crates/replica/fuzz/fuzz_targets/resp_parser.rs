//! Fuzz the RESP request parser: arbitrary bytes, parsed request after
//! request as the server does. Properties: no panic; a complete request
//! consumes at least one byte and no more than it was given; every
//! argument range lies inside the consumed bytes and within the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spindle_replica::resp::{parse_request, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        args_max: 16,
        bulk_bytes_max: 256,
        inline_bytes_max: 512,
    };
    let mut args = Vec::new();
    let mut at = 0;
    // At most one request per input byte: the loop is bounded.
    for _ in 0..=data.len() {
        match parse_request(&data[at..], &limits, &mut args) {
            Ok(Some(used)) => {
                assert!(
                    used > 0 && used <= data.len() - at,
                    "consumed {used} of {}",
                    data.len() - at
                );
                assert!(args.len() <= limits.args_max, "{} arguments", args.len());
                for r in &args {
                    assert!(r.end <= used && r.len() <= limits.bulk_bytes_max.max(limits.inline_bytes_max));
                }
                at += used;
            }
            Ok(None) | Err(_) => return,
        }
    }
});
