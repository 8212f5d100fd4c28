//! The key-value commands (sans-IO): turn one parsed RESP request into
//! log appends, object-map changes and a RESP reply.
//!
//! Writes go to the log first and are applied to the objects only once
//! the [`Replicator`] says every backup has them, so a read never returns
//! a value that a failover could lose.

use std::ops::Range;

use crate::record::{RecordKind, KEY_BYTES_MAX};
use crate::resp::reply;
use crate::store::ObjectMap;

/// Appends records to the replicated log.
pub trait Replicator {
    /// Append one record and return once it is replicated to every backup
    /// (acknowledged), or an error that the client sees (`-ERR …`).
    /// `batch_rest`: records of the same batch still to come (0: the last
    /// record of a batch, or a record on its own); recovery applies a
    /// batch whole or not at all.
    fn append(
        &mut self,
        kind: RecordKind,
        key: &[u8],
        value: &[u8],
        version: u64,
        batch_rest: u32,
    ) -> Result<(), String>;
}

/// The arguments of one request: ranges into the read buffer.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    pub buf: &'a [u8],
    pub ranges: &'a [Range<usize>],
}

impl<'a> Args<'a> {
    pub fn len(&self) -> usize {
        self.ranges.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
    pub fn get(&self, i: usize) -> &'a [u8] {
        &self.buf[self.ranges[i].clone()]
    }
}

/// What the connection does after a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Reply, then close the connection (QUIT).
    Close,
}

/// Bounds the commands enforce.
#[derive(Clone, Copy, Debug)]
pub struct CommandLimits {
    pub value_bytes_max: usize,
}

/// Execute one request, appending the reply to `out`.
pub fn execute(
    args: Args<'_>,
    objects: &mut ObjectMap,
    log: &mut dyn Replicator,
    limits: &CommandLimits,
    info: &dyn Fn(&ObjectMap) -> String,
    out: &mut Vec<u8>,
) -> Flow {
    if args.is_empty() {
        return Flow::Continue;
    }
    let name = args.get(0);
    let mut upper = [0u8; 8];
    let n = name.len().min(8);
    for (u, c) in upper.iter_mut().zip(name) {
        *u = c.to_ascii_uppercase();
    }
    let argc = args.len();
    let arity = |ok: bool, out: &mut Vec<u8>| {
        if !ok {
            reply::error(
                out,
                &format!(
                    "ERR wrong number of arguments for '{}' command",
                    String::from_utf8_lossy(name).to_lowercase()
                ),
            );
        }
        ok
    };
    let command: &[u8] = if name.len() <= 8 { &upper[..n] } else { b"" };
    match command {
        b"PING" if arity(argc <= 2, out) => {
            if argc == 2 {
                reply::bulk(out, args.get(1));
            } else {
                reply::simple(out, "PONG");
            }
        }
        b"QUIT" => {
            reply::simple(out, "OK");
            return Flow::Close;
        }
        b"GET" if arity(argc == 2, out) => match objects.get(args.get(1)) {
            Some(o) => reply::bulk(out, &o.value),
            None => reply::null(out),
        },
        b"SET" if arity(argc >= 3, out) => {
            if argc > 3 {
                reply::error(out, "ERR syntax error (SET options are not supported)");
            } else if let Err(e) = put(args.get(1), args.get(2), objects, log, limits) {
                reply::error(out, &e);
            } else {
                reply::simple(out, "OK");
            }
        }
        b"MSET" if arity(argc >= 3 && argc % 2 == 1, out) => match mset(args, objects, log, limits) {
            Ok(()) => reply::simple(out, "OK"),
            Err(e) => reply::error(out, &e),
        },
        b"MGET" if arity(argc >= 2, out) => {
            reply::array_header(out, argc - 1);
            for i in 1..argc {
                match objects.get(args.get(i)) {
                    Some(o) => reply::bulk(out, &o.value),
                    None => reply::null(out),
                }
            }
        }
        b"DEL" if arity(argc >= 2, out) => {
            let mut deleted = 0i64;
            for i in 1..argc {
                let key = args.get(i);
                if objects.get(key).is_none() {
                    continue;
                }
                let version = objects.next_version();
                if let Err(e) = log.append(RecordKind::Delete, key, &[], version, 0) {
                    reply::error(out, &format!("ERR replication failed: {e}"));
                    return Flow::Continue;
                }
                objects.delete(key, version);
                deleted += 1;
            }
            reply::integer(out, deleted);
        }
        b"EXISTS" if arity(argc >= 2, out) => {
            let n = (1..argc).filter(|i| objects.get(args.get(*i)).is_some()).count();
            reply::integer(out, n as i64);
        }
        b"INCR" if arity(argc == 2, out) => match incr(args.get(1), objects, log, limits) {
            Ok(n) => reply::integer(out, n),
            Err(e) => reply::error(out, &e),
        },
        b"DBSIZE" if arity(argc == 1, out) => reply::integer(out, objects.len() as i64),
        b"INFO" => reply::bulk(out, info(objects).as_bytes()),
        b"PING" | b"GET" | b"SET" | b"MSET" | b"MGET" | b"DEL" | b"EXISTS" | b"INCR" | b"DBSIZE" => {}
        _ => unknown(args, out),
    }
    Flow::Continue
}

fn unknown(args: Args<'_>, out: &mut Vec<u8>) {
    let mut message = format!(
        "ERR unknown command '{}', with args beginning with:",
        String::from_utf8_lossy(&args.get(0)[..args.get(0).len().min(128)])
    );
    for i in 1..args.len().min(4) {
        let a = args.get(i);
        message.push_str(&format!(" '{}'", String::from_utf8_lossy(&a[..a.len().min(64)])));
    }
    reply::error(out, &message);
}

fn put(
    key: &[u8],
    value: &[u8],
    objects: &mut ObjectMap,
    log: &mut dyn Replicator,
    limits: &CommandLimits,
) -> Result<(), String> {
    check_key(key)?;
    if value.len() > limits.value_bytes_max {
        return Err(format!(
            "ERR value of {} bytes is larger than value_bytes_max {}",
            value.len(),
            limits.value_bytes_max
        ));
    }
    if !objects.fits(key, value.len()) {
        return Err("OOM command not allowed when used memory > 'maxmemory'".into());
    }
    let version = objects.next_version();
    log.append(RecordKind::Put, key, value, version, 0)
        .map_err(|e| format!("ERR replication failed: {e}"))?;
    objects.put(key, value, version);
    Ok(())
}

/// MSET is atomic: one batch of records, applied once the last is
/// acknowledged; recovery drops a batch that is not complete.
fn mset(
    args: Args<'_>,
    objects: &mut ObjectMap,
    log: &mut dyn Replicator,
    limits: &CommandLimits,
) -> Result<(), String> {
    let pairs = (args.len() - 1) / 2;
    let mut added = 0usize;
    for i in 0..pairs {
        let (key, value) = (args.get(1 + 2 * i), args.get(2 + 2 * i));
        check_key(key)?;
        if value.len() > limits.value_bytes_max {
            return Err(format!(
                "ERR value of {} bytes is larger than value_bytes_max {}",
                value.len(),
                limits.value_bytes_max
            ));
        }
        added += key.len() + value.len() + crate::store::OBJECT_OVERHEAD_BYTES;
    }
    if objects.bytes() + added > objects.bytes_max() {
        return Err("OOM command not allowed when used memory > 'maxmemory'".into());
    }
    let base = objects.next_version();
    for i in 0..pairs {
        let rest = (pairs - 1 - i) as u32;
        log.append(
            RecordKind::Put,
            args.get(1 + 2 * i),
            args.get(2 + 2 * i),
            base + i as u64,
            rest,
        )
        .map_err(|e| format!("ERR replication failed: {e}"))?;
    }
    for i in 0..pairs {
        objects.put(args.get(1 + 2 * i), args.get(2 + 2 * i), base + i as u64);
    }
    Ok(())
}

fn check_key(key: &[u8]) -> Result<(), String> {
    if key.is_empty() || key.len() > KEY_BYTES_MAX {
        return Err(format!(
            "ERR key of {} bytes: keys must be 1..={KEY_BYTES_MAX} bytes",
            key.len()
        ));
    }
    Ok(())
}

fn incr(key: &[u8], objects: &mut ObjectMap, log: &mut dyn Replicator, limits: &CommandLimits) -> Result<i64, String> {
    let current = match objects.get(key) {
        None => 0i64,
        Some(o) => std::str::from_utf8(&o.value)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or("ERR value is not an integer or out of range")?,
    };
    let next = current
        .checked_add(1)
        .ok_or("ERR increment or decrement would overflow")?;
    let mut text = [0u8; 24];
    let len = {
        use std::io::Write;
        let mut cursor = std::io::Cursor::new(&mut text[..]);
        write!(cursor, "{next}").expect("an i64 fits 24 bytes");
        cursor.position() as usize
    };
    put(key, &text[..len], objects, log, limits)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{parse_request, Limits};

    #[derive(Default)]
    struct Recorder(Vec<(RecordKind, Vec<u8>, Vec<u8>, u64)>);
    impl Replicator for Recorder {
        fn append(
            &mut self,
            kind: RecordKind,
            key: &[u8],
            value: &[u8],
            version: u64,
            rest: u32,
        ) -> Result<(), String> {
            assert!(rest < 8, "batch_rest counts down");
            self.0.push((kind, key.to_vec(), value.to_vec(), version));
            Ok(())
        }
    }

    fn run(objects: &mut ObjectMap, log: &mut Recorder, request: &str) -> String {
        let mut ranges = Vec::new();
        let buf = request.as_bytes();
        parse_request(buf, &Limits::for_values(1 << 20), &mut ranges)
            .unwrap()
            .unwrap();
        let mut out = Vec::new();
        let limits = CommandLimits {
            value_bytes_max: 1 << 20,
        };
        execute(
            Args { buf, ranges: &ranges },
            objects,
            log,
            &limits,
            &|_| "x".into(),
            &mut out,
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_session() {
        let mut objects = ObjectMap::new(1 << 20);
        let mut log = Recorder::default();
        assert_eq!(run(&mut objects, &mut log, "PING\r\n"), "+PONG\r\n");
        assert_eq!(run(&mut objects, &mut log, "SET a 1\r\n"), "+OK\r\n");
        assert_eq!(run(&mut objects, &mut log, "INCR a\r\n"), ":2\r\n");
        assert_eq!(run(&mut objects, &mut log, "GET a\r\n"), "$1\r\n2\r\n");
        assert_eq!(run(&mut objects, &mut log, "MSET b x c y\r\n"), "+OK\r\n");
        assert_eq!(
            run(&mut objects, &mut log, "MGET a nope c\r\n"),
            "*3\r\n$1\r\n2\r\n$-1\r\n$1\r\ny\r\n"
        );
        assert_eq!(run(&mut objects, &mut log, "EXISTS a b nope\r\n"), ":2\r\n");
        assert_eq!(run(&mut objects, &mut log, "DEL a nope\r\n"), ":1\r\n");
        assert_eq!(run(&mut objects, &mut log, "DBSIZE\r\n"), ":2\r\n");
        assert_eq!(
            run(&mut objects, &mut log, "INCR b\r\n"),
            "-ERR value is not an integer or out of range\r\n"
        );
        assert_eq!(log.0.len(), 5, "SET, INCR, 2 × MSET, DEL are logged; reads are not");
        let versions: Vec<u64> = log.0.iter().map(|r| r.3).collect();
        assert!(
            versions.windows(2).all(|w| w[0] < w[1]),
            "versions increase: {versions:?}"
        );
    }

    #[test]
    fn errors_are_resp_errors() {
        let mut objects = ObjectMap::new(1 << 20);
        let mut log = Recorder::default();
        assert_eq!(
            run(&mut objects, &mut log, "FLUSHALL now\r\n"),
            "-ERR unknown command 'FLUSHALL', with args beginning with: 'now'\r\n"
        );
        assert_eq!(
            run(&mut objects, &mut log, "GET\r\n"),
            "-ERR wrong number of arguments for 'get' command\r\n"
        );
        assert_eq!(run(&mut objects, &mut log, "QUIT\r\n"), "+OK\r\n");
        let mut small = ObjectMap::new(100);
        assert!(run(
            &mut small,
            &mut log,
            "SET k 0123456789012345678901234567890123456789\r\n"
        )
        .starts_with("-OOM"));
    }
}
