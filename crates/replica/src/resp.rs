//! RESP (the Redis serialization protocol), request side: a bounded,
//! sans-IO parser of client requests and the reply encoders.
//!
//! A request is either a multibulk array of bulk strings (what every
//! client library, `redis-cli` and `redis-benchmark` send):
//!
//! ```text
//!  *<argc>\r\n  then argc × ( $<len>\r\n <len bytes> \r\n )
//! ```
//!
//! or an inline command (`PING\r\n`, as typed into telnet): one line of
//! words separated by spaces. The parser never allocates per request: it
//! writes the argument ranges into a caller-owned vector. Every length is
//! bounded by [`Limits`]; anything over a bound or malformed is a protocol
//! error, answered with `-ERR Protocol error: …` before the connection is
//! closed, as Redis does.
//!
//! ```
//! use spindle_replica::resp::{parse_request, Limits};
//! let stream = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n";
//! let mut args = Vec::new();
//! let used = parse_request(stream, &Limits::for_values(1024), &mut args).unwrap().unwrap();
//! assert_eq!((&stream[args[0].clone()], &stream[args[1].clone()]), (&b"GET"[..], &b"k"[..]));
//! assert_eq!(parse_request(&stream[used..], &Limits::for_values(1024), &mut args).unwrap(), Some(6));
//! ```

use std::ops::Range;

/// Bounds on what one request may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Arguments in one request (command name included).
    pub args_max: usize,
    /// Bytes of one bulk string.
    pub bulk_bytes_max: usize,
    /// Bytes of one inline command line.
    pub inline_bytes_max: usize,
}

impl Limits {
    /// Defaults sized for values up to `value_bytes_max`.
    pub fn for_values(value_bytes_max: usize) -> Limits {
        Limits {
            args_max: 1 + 2 * 1024,
            bulk_bytes_max: value_bytes_max.max(crate::record::KEY_BYTES_MAX),
            inline_bytes_max: 64 * 1024,
        }
    }
}

/// A malformed or oversized request. The text is what Redis says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

/// Parse one request from the front of `buf`. On success returns the
/// bytes it used, with the arguments' ranges (into `buf`) in `args`;
/// `Ok(None)` when `buf` does not hold a whole request yet. An empty
/// inline line is consumed and yields no arguments.
pub fn parse_request(
    buf: &[u8],
    limits: &Limits,
    args: &mut Vec<Range<usize>>,
) -> Result<Option<usize>, ProtocolError> {
    args.clear();
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        return parse_inline(buf, limits, args);
    }
    let Some((argc, mut at)) = read_number_line(buf, 1, limits.inline_bytes_max)? else {
        return Ok(None);
    };
    if argc > limits.args_max as i64 {
        return Err(ProtocolError(format!(
            "invalid multibulk length ({argc} arguments, at most {})",
            limits.args_max
        )));
    }
    if argc <= 0 {
        return Ok(Some(at));
    }
    for _ in 0..argc {
        if at >= buf.len() {
            return Ok(None);
        }
        if buf[at] != b'$' {
            return Err(ProtocolError(format!("expected '$', got '{}'", buf[at].escape_ascii())));
        }
        let Some((len, body)) = read_number_line(buf, at + 1, limits.inline_bytes_max)? else {
            return Ok(None);
        };
        if len < 0 || len as u64 > limits.bulk_bytes_max as u64 {
            return Err(ProtocolError(format!(
                "invalid bulk length ({len} bytes, at most {})",
                limits.bulk_bytes_max
            )));
        }
        let end = body + len as usize;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError("bulk string not followed by CRLF".into()));
        }
        args.push(body..end);
        at = end + 2;
    }
    Ok(Some(at))
}

/// `<digits>\r\n` starting at `from`: the number and the index after it.
fn read_number_line(buf: &[u8], from: usize, line_max: usize) -> Result<Option<(i64, usize)>, ProtocolError> {
    let window = &buf[from.min(buf.len())..buf.len().min(from + 32)];
    let Some(cr) = window.iter().position(|b| *b == b'\r') else {
        if window.len() >= 32.min(line_max) {
            return Err(ProtocolError("length line too long".into()));
        }
        return Ok(None);
    };
    if from + cr + 1 >= buf.len() {
        return Ok(None);
    }
    if buf[from + cr + 1] != b'\n' {
        return Err(ProtocolError("length line not ended by CRLF".into()));
    }
    let digits = &window[..cr];
    let n = parse_i64(digits).ok_or_else(|| {
        ProtocolError(format!(
            "invalid length '{}'",
            String::from_utf8_lossy(digits).escape_default()
        ))
    })?;
    Ok(Some((n, from + cr + 2)))
}

/// `digits` as `i64::from_str` reads it (an optional `+` or `-`, then one
/// or more ASCII digits, in range), without the UTF-8 check and the
/// generic parser on every length line (they were 3-4% of the master's
/// CPU under redis-benchmark -P 16).
pub(crate) fn parse_i64(digits: &[u8]) -> Option<i64> {
    let (negative, digits) = match digits {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, digits),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n = n.checked_mul(10)?;
        n = if negative {
            n.checked_sub(d as i64)?
        } else {
            n.checked_add(d as i64)?
        };
    }
    Some(n)
}

fn parse_inline(buf: &[u8], limits: &Limits, args: &mut Vec<Range<usize>>) -> Result<Option<usize>, ProtocolError> {
    let scan = &buf[..buf.len().min(limits.inline_bytes_max + 1)];
    let Some(nl) = scan.iter().position(|b| *b == b'\n') else {
        if scan.len() > limits.inline_bytes_max {
            return Err(ProtocolError("too big inline request".into()));
        }
        return Ok(None);
    };
    let line_end = if nl > 0 && buf[nl - 1] == b'\r' { nl - 1 } else { nl };
    let mut i = 0;
    while i < line_end {
        while i < line_end && (buf[i] == b' ' || buf[i] == b'\t') {
            i += 1;
        }
        let start = i;
        while i < line_end && buf[i] != b' ' && buf[i] != b'\t' {
            i += 1;
        }
        if i > start {
            if args.len() == limits.args_max {
                return Err(ProtocolError("too many arguments in inline request".into()));
            }
            args.push(start..i);
        }
    }
    Ok(Some(nl + 1))
}

/// Reply encoders (append to an output buffer).
pub mod reply {
    use std::io::Write;

    pub fn simple(out: &mut Vec<u8>, s: &str) {
        out.push(b'+');
        out.extend_from_slice(s.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    /// `-<message>\r\n`; the message must not hold CR or LF.
    pub fn error(out: &mut Vec<u8>, message: &str) {
        out.push(b'-');
        out.extend(message.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
        out.extend_from_slice(b"\r\n");
    }
    /// `<kind><n>\r\n`, the header line of most replies, with the digits
    /// written directly: `write!` through `core::fmt` was about 1% of the
    /// master's CPU under `redis-benchmark -t get -P 16` (a bulk header
    /// per GET). The same bytes as `write!(out, "{kind}{n}\r\n")`
    /// (proptested).
    pub fn header_line(out: &mut Vec<u8>, kind: u8, n: i64) {
        // i64::MIN has 19 digits and a sign.
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut rest = n.unsigned_abs();
        loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        if n < 0 {
            at -= 1;
            digits[at] = b'-';
        }
        out.push(kind);
        out.extend_from_slice(&digits[at..]);
        out.extend_from_slice(b"\r\n");
    }
    pub fn integer(out: &mut Vec<u8>, n: i64) {
        header_line(out, b':', n);
    }
    pub fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
        header_line(out, b'$', bytes.len() as i64);
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\r\n");
    }
    /// The RESP2 null bulk string (`$-1`).
    pub fn null(out: &mut Vec<u8>) {
        out.extend_from_slice(b"$-1\r\n");
    }
    /// A null in the connection's protocol: RESP3's `_`, else `$-1`.
    pub fn null_in(out: &mut Vec<u8>, resp3: bool) {
        out.extend_from_slice(if resp3 { b"_\r\n" } else { b"$-1\r\n" });
    }
    pub fn array_header(out: &mut Vec<u8>, len: usize) {
        header_line(out, b'*', len as i64);
    }
    /// A map of `pairs` key-value pairs: RESP3's `%`, else a flat array
    /// of `2 × pairs` items (what Redis sends a RESP2 client).
    pub fn map_header(out: &mut Vec<u8>, pairs: usize, resp3: bool) {
        if resp3 {
            let _ = write!(out, "%{pairs}\r\n");
        } else {
            array_header(out, 2 * pairs);
        }
    }
    /// A set: RESP3's `~`, else an array.
    pub fn set_header(out: &mut Vec<u8>, len: usize, resp3: bool) {
        if resp3 {
            let _ = write!(out, "~{len}\r\n");
        } else {
            array_header(out, len);
        }
    }
    /// RESP3 verbatim text (`=len\r\ntxt:…`), else a bulk string.
    pub fn verbatim(out: &mut Vec<u8>, text: &[u8], resp3: bool) {
        if resp3 {
            let _ = write!(out, "={}\r\ntxt:", text.len() + 4);
            out.extend_from_slice(text);
            out.extend_from_slice(b"\r\n");
        } else {
            bulk(out, text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Parsed = Option<(usize, Vec<Vec<u8>>)>;

    proptest::proptest! {
        #[test]
        fn header_lines_are_what_write_makes(kind in proptest::sample::select(b":$*%~".to_vec()),
                                             n in proptest::prelude::any::<i64>()) {
            let mut direct = Vec::new();
            reply::header_line(&mut direct, kind, n);
            let mut formatted = Vec::new();
            use std::io::Write;
            write!(formatted, "{}{n}\r\n", kind as char).unwrap();
            proptest::prop_assert_eq!(direct, formatted);
        }

        /// The length parser reads what `i64::from_str` reads, and
        /// refuses what it refuses.
        #[test]
        fn lengths_parse_as_i64_from_str(bytes in proptest::collection::vec(
            proptest::sample::select(b"+-0123456789x \xff".to_vec()), 0..24)) {
            let want = std::str::from_utf8(&bytes).ok().and_then(|t| t.parse::<i64>().ok());
            proptest::prop_assert_eq!(parse_i64(&bytes), want);
        }
    }

    #[test]
    fn lengths_at_the_edges_of_i64() {
        for text in ["0", "-0", "+7", "9223372036854775807", "-9223372036854775808", "00012"] {
            assert_eq!(parse_i64(text.as_bytes()), text.parse().ok(), "{text}");
        }
        for text in [
            "",
            "-",
            "+",
            "9223372036854775808",
            "-9223372036854775809",
            "1 ",
            "--1",
            "+-1",
            "١",
        ] {
            assert_eq!(parse_i64(text.as_bytes()), None, "{text}");
        }
    }

    fn parse(buf: &[u8]) -> Result<Parsed, ProtocolError> {
        let mut args = Vec::new();
        let limits = Limits::for_values(1024);
        Ok(
            parse_request(buf, &limits, &mut args)?
                .map(|n| (n, args.iter().map(|r| buf[r.clone()].to_vec()).collect())),
        )
    }

    #[test]
    fn multibulk_and_pipelining() {
        let two = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n";
        let (n, args) = parse(two).unwrap().unwrap();
        assert_eq!(args, vec![b"GET".to_vec(), b"k".to_vec()]);
        let (m, args) = parse(&two[n..]).unwrap().unwrap();
        assert_eq!((n + m, args), (two.len(), vec![b"PING".to_vec()]));
    }

    #[test]
    fn every_prefix_is_incomplete_not_an_error() {
        let req = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n";
        for cut in 0..req.len() {
            assert_eq!(parse(&req[..cut]).unwrap(), None, "prefix of {cut} bytes");
        }
    }

    #[test]
    fn inline_commands() {
        let (n, args) = parse(b"SET  a b\r\nGET a\n").unwrap().unwrap();
        assert_eq!((n, args), (10, vec![b"SET".to_vec(), b"a".to_vec(), b"b".to_vec()]));
        assert_eq!(parse(b"\r\n").unwrap(), Some((2, vec![])));
    }

    #[test]
    fn oversized_and_malformed_are_protocol_errors() {
        assert!(parse(b"*99999\r\n").is_err());
        assert!(parse(b"*1\r\n$99999\r\n").is_err());
        assert!(parse(b"*1\r\n:3\r\n").is_err());
        assert!(parse(b"*1\r\n$-5\r\n").is_err());
        assert!(parse(b"*x\r\n").is_err());
        assert!(parse(b"*1\r\n$1\r\nab\r\n").is_err());
        assert!(parse(&[b'a'; 70_000]).is_err());
    }
}
