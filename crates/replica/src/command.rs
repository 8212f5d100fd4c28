//! The key-value commands (sans-IO): turn one parsed RESP request into
//! log appends, object-map changes and a RESP reply.
//!
//! Writes go to the log first and are applied to the objects only once
//! the [`Replicator`] says every backup has them, so a read never returns
//! a value that a failover could lose.
//!
//! The commands are the subset of Redis that client libraries need
//! ([`crate::keyspace::COMMANDS`]); their replies follow Redis 7, in RESP2
//! or, after `HELLO 3`, RESP3 ([`Session`]). Expiry is decided here, on
//! the master, with the caller's clock (`now_ms`): an expiry is written
//! as an expire record holding the absolute time, and a key found due is
//! deleted with a delete record before a command sees it, so backups and
//! a promoted backup hold exactly what the master decided.
//!
//! Authentication: Spindle has none. `AUTH default <anything>` and
//! `HELLO … AUTH default <anything>` are accepted (Redis's passwordless
//! `default` user); any other user is `-WRONGPASS`, and `AUTH <password>`
//! alone is the error Redis gives when no password is configured.

use std::ops::Range;

use crate::keyspace::{arity_ok, glob_match, lookup, scan_step, COMMANDS};
use crate::record::{expire_value, RecordKind, KEY_BYTES_MAX};
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

/// One client connection's state.
#[derive(Clone, Debug, Default)]
pub struct Session {
    /// The connection's id (`CLIENT ID`), unique in the server.
    pub id: u64,
    /// Replies in RESP3 (after `HELLO 3`).
    pub resp3: bool,
    /// `CLIENT SETNAME` / `HELLO … SETNAME`.
    pub name: Option<Box<[u8]>>,
    /// `CLIENT SETINFO lib-name` / `lib-ver`.
    pub lib: Option<String>,
}

/// What a command works on.
pub struct Context<'a> {
    pub objects: &'a mut ObjectMap,
    pub log: &'a mut dyn Replicator,
    pub limits: &'a CommandLimits,
    /// The `INFO` text.
    pub info: &'a dyn Fn(&ObjectMap) -> String,
    /// The master's clock (unix ms): expiry is decided against it.
    pub now_ms: u64,
}

/// Due keys deleted per command before it runs (the rest go at later
/// commands; a key a command names is deleted when due whatever the
/// budget).
pub const EXPIRE_SWEEP_MAX: usize = 16;

/// Execute one request, appending the reply to `out`.
pub fn execute(args: Args<'_>, ctx: &mut Context<'_>, session: &mut Session, out: &mut Vec<u8>) -> Flow {
    if args.is_empty() {
        return Flow::Continue;
    }
    let name = args.get(0);
    let Some(spec) = lookup(name) else {
        unknown(args, out);
        return Flow::Continue;
    };
    if !arity_ok(spec, args.len()) {
        reply::error(
            out,
            &format!("ERR wrong number of arguments for '{}' command", spec.name),
        );
        return Flow::Continue;
    }
    if let Err(e) = sweep(ctx, EXPIRE_SWEEP_MAX) {
        reply::error(out, &e);
        return Flow::Continue;
    }
    match dispatch(spec.name, args, ctx, session, out) {
        Ok(flow) => flow,
        Err(e) => {
            reply::error(out, &e);
            Flow::Continue
        }
    }
}

fn dispatch(
    name: &str,
    args: Args<'_>,
    ctx: &mut Context<'_>,
    session: &mut Session,
    out: &mut Vec<u8>,
) -> Result<Flow, String> {
    let argc = args.len();
    let resp3 = session.resp3;
    // A string match compares its arms in order: the two commands a cache
    // mostly sees come first (GET was the twelfth comparison).
    match name {
        "get" => {
            let key = args.get(1);
            // One lookup, not expire_if_due's and then GET's own.
            match ctx.objects.get(key) {
                Some(o) if o.expired(ctx.now_ms) => {
                    delete_one(ctx, key)?;
                    reply::null_in(out, resp3);
                }
                Some(o) => reply::bulk(out, &o.value),
                None => reply::null_in(out, resp3),
            }
        }
        "set" => set(args, ctx, resp3, out)?,
        "ping" if argc <= 2 => match argc {
            2 => reply::bulk(out, args.get(1)),
            _ => reply::simple(out, "PONG"),
        },
        "ping" => return Err("ERR wrong number of arguments for 'ping' command".into()),
        "echo" => reply::bulk(out, args.get(1)),
        "quit" => {
            reply::simple(out, "OK");
            return Ok(Flow::Close);
        }
        "hello" => hello(args, session, out)?,
        "auth" => auth(args.get(argc - 2), args.get(argc - 1), argc == 2).map(|()| reply::simple(out, "OK"))?,
        "select" => match args.get(1) {
            b"0" => reply::simple(out, "OK"),
            _ => return Err("ERR DB index is out of range".into()),
        },
        "client" => client(args, session, out)?,
        "command" => command(args, resp3, out)?,
        "config" => config(args, resp3, out)?,
        "info" => reply::verbatim(out, (ctx.info)(ctx.objects).as_bytes(), resp3),
        "dbsize" => reply::integer(out, ctx.objects.len() as i64),
        "setnx" => {
            let key = args.get(1);
            expire_if_due(ctx, key)?;
            let absent = ctx.objects.get(key).is_none();
            if absent {
                put(ctx, key, args.get(2), 0)?;
            }
            reply::integer(out, absent as i64);
        }
        "getset" => {
            let key = args.get(1);
            expire_if_due(ctx, key)?;
            let old = ctx.objects.get(key).map(|o| o.value.clone());
            put(ctx, key, args.get(2), 0)?;
            match old {
                Some(v) => reply::bulk(out, &v),
                None => reply::null_in(out, resp3),
            }
        }
        "append" => {
            let key = args.get(1);
            expire_if_due(ctx, key)?;
            let (mut value, ttl) = match ctx.objects.get(key) {
                Some(o) => (o.value.to_vec(), o.expires_at_ms),
                None => (Vec::new(), 0),
            };
            value.extend_from_slice(args.get(2));
            put(ctx, key, &value, ttl)?;
            reply::integer(out, value.len() as i64);
        }
        "strlen" => {
            let key = args.get(1);
            expire_if_due(ctx, key)?;
            reply::integer(out, ctx.objects.get(key).map_or(0, |o| o.value.len()) as i64);
        }
        "mset" if argc % 2 == 1 => {
            mset(args, ctx)?;
            reply::simple(out, "OK");
        }
        "mset" => return Err("ERR wrong number of arguments for 'mset' command".into()),
        "mget" => {
            reply::array_header(out, argc - 1);
            for i in 1..argc {
                expire_if_due(ctx, args.get(i))?;
                match ctx.objects.get(args.get(i)) {
                    Some(o) => reply::bulk(out, &o.value),
                    None => reply::null_in(out, resp3),
                }
            }
        }
        "del" | "unlink" => reply::integer(out, delete_keys(args, ctx)?),
        "exists" => {
            let mut n = 0;
            for i in 1..argc {
                expire_if_due(ctx, args.get(i))?;
                n += ctx.objects.get(args.get(i)).is_some() as i64;
            }
            reply::integer(out, n);
        }
        "type" => {
            expire_if_due(ctx, args.get(1))?;
            reply::simple(
                out,
                if ctx.objects.get(args.get(1)).is_some() {
                    "string"
                } else {
                    "none"
                },
            );
        }
        "incr" | "decr" | "incrby" | "decrby" => {
            let by = if argc == 3 { integer_arg(args.get(2))? } else { 1 };
            let delta = if name.starts_with("decr") {
                by.checked_neg().ok_or("ERR decrement would overflow")?
            } else {
                by
            };
            reply::integer(out, incr_by(ctx, args.get(1), delta)?);
        }
        "expire" | "pexpire" | "expireat" | "pexpireat" => reply::integer(out, expire(name, args, ctx)? as i64),
        "ttl" | "pttl" => {
            let key = args.get(1);
            expire_if_due(ctx, key)?;
            let ttl = match ctx.objects.get(key) {
                None => -2,
                Some(o) if o.expires_at_ms == 0 => -1,
                Some(o) => {
                    let left_ms = o.expires_at_ms.saturating_sub(ctx.now_ms) as i64;
                    if name == "pttl" {
                        left_ms
                    } else {
                        (left_ms + 500) / 1000
                    }
                }
            };
            reply::integer(out, ttl);
        }
        "persist" => {
            let key = args.get(1);
            expire_if_due(ctx, key)?;
            let had = ctx.objects.get(key).is_some_and(|o| o.expires_at_ms != 0);
            if had {
                set_expiry(ctx, key, 0)?;
            }
            reply::integer(out, had as i64);
        }
        "keys" => {
            let now = ctx.now_ms;
            let pattern = args.get(1);
            let objects = &*ctx.objects;
            let keys: Vec<&[u8]> = objects
                .keys()
                .filter(|k| objects.get_live(k, now).is_some() && glob_match(pattern, k))
                .collect();
            reply::array_header(out, keys.len());
            for k in keys {
                reply::bulk(out, k);
            }
        }
        "scan" => scan(args, ctx, out)?,
        "flushdb" | "flushall" => {
            if argc > 2 || (argc == 2 && !matches!(upper(args.get(1)).as_str(), "ASYNC" | "SYNC")) {
                return Err("ERR syntax error".into());
            }
            let version = ctx.objects.next_version();
            ctx.log
                .append(RecordKind::Flush, &[], &[], version, 0)
                .map_err(replication_failed)?;
            ctx.objects.flush(version);
            reply::simple(out, "OK");
        }
        other => unreachable!("command table entry '{other}' without a handler"),
    }
    Ok(Flow::Continue)
}

fn replication_failed(e: String) -> String {
    format!("ERR replication failed: {e}")
}

fn upper(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
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

/// A signed 64-bit integer argument.
fn integer_arg(arg: &[u8]) -> Result<i64, String> {
    crate::resp::parse_i64(arg).ok_or_else(|| "ERR value is not an integer or out of range".to_string())
}

/// Delete the objects whose expiry is due (at most `max`), each with a
/// delete record: the master decides expiry, backups replay it.
fn sweep(ctx: &mut Context<'_>, max: usize) -> Result<(), String> {
    for key in ctx.objects.due(ctx.now_ms, max) {
        delete_one(ctx, &key)?;
    }
    Ok(())
}

/// Delete `key` (with a delete record) if its expiry is due.
fn expire_if_due(ctx: &mut Context<'_>, key: &[u8]) -> Result<(), String> {
    if ctx.objects.get(key).is_some_and(|o| o.expired(ctx.now_ms)) {
        delete_one(ctx, key)?;
    }
    Ok(())
}

fn delete_one(ctx: &mut Context<'_>, key: &[u8]) -> Result<(), String> {
    let version = ctx.objects.next_version();
    ctx.log
        .append(RecordKind::Delete, key, &[], version, 0)
        .map_err(replication_failed)?;
    let existed = ctx.objects.delete(key, version);
    debug_assert!(existed, "only existing keys are deleted by expiry");
    Ok(())
}

/// DEL / UNLINK: one batch of delete records (atomic, like MSET).
fn delete_keys(args: Args<'_>, ctx: &mut Context<'_>) -> Result<i64, String> {
    let mut keys: Vec<&[u8]> = Vec::with_capacity(args.len() - 1);
    for i in 1..args.len() {
        let key = args.get(i);
        expire_if_due(ctx, key)?;
        if ctx.objects.get(key).is_some() && !keys.contains(&key) {
            keys.push(key);
        }
    }
    let base = ctx.objects.next_version();
    for (i, key) in keys.iter().enumerate() {
        let rest = (keys.len() - 1 - i) as u32;
        ctx.log
            .append(RecordKind::Delete, key, &[], base + i as u64, rest)
            .map_err(replication_failed)?;
    }
    for (i, key) in keys.iter().enumerate() {
        let existed = ctx.objects.delete(key, base + i as u64);
        assert!(existed, "DEL: every key of the batch exists");
    }
    Ok(keys.len() as i64)
}

fn check_value(ctx: &Context<'_>, key: &[u8], value: &[u8]) -> Result<(), String> {
    check_key(key)?;
    if value.len() > ctx.limits.value_bytes_max {
        return Err(format!(
            "ERR value of {} bytes is larger than value_bytes_max {}",
            value.len(),
            ctx.limits.value_bytes_max
        ));
    }
    if !ctx.objects.fits(key, value.len()) {
        return Err("OOM command not allowed when used memory > 'maxmemory'".into());
    }
    Ok(())
}

/// Store `value` under `key` with expiry `expires_at_ms` (0: none): one
/// put record, or a batch of a put and an expire record.
fn put(ctx: &mut Context<'_>, key: &[u8], value: &[u8], expires_at_ms: u64) -> Result<(), String> {
    check_value(ctx, key, value)?;
    let version = ctx.objects.next_version();
    let with_expiry = expires_at_ms != 0;
    ctx.log
        .append(RecordKind::Put, key, value, version, with_expiry as u32)
        .map_err(replication_failed)?;
    if with_expiry {
        ctx.log
            .append(RecordKind::Expire, key, &expire_value(expires_at_ms), version + 1, 0)
            .map_err(replication_failed)?;
    }
    ctx.objects.put(key, value, version);
    if with_expiry {
        let existed = ctx.objects.set_expiry(key, expires_at_ms, version + 1);
        assert!(existed, "an expiry follows its put");
    }
    Ok(())
}

/// Set (`expires_at_ms` > 0) or clear (0) an existing key's expiry with an
/// expire record.
fn set_expiry(ctx: &mut Context<'_>, key: &[u8], expires_at_ms: u64) -> Result<(), String> {
    let version = ctx.objects.next_version();
    ctx.log
        .append(RecordKind::Expire, key, &expire_value(expires_at_ms), version, 0)
        .map_err(replication_failed)?;
    let existed = ctx.objects.set_expiry(key, expires_at_ms, version);
    assert!(existed, "expiry of an existing key");
    Ok(())
}

/// An expiry argument in `unit_ms` from now (or absolute when
/// `absolute`) as an absolute unix-ms time; `None` when it is not in the
/// future (Redis then deletes the key).
fn expiry_at(arg: &[u8], unit_ms: i64, absolute: bool, now_ms: u64, command: &str) -> Result<Option<u64>, String> {
    let n = integer_arg(arg)?;
    let invalid = || format!("ERR invalid expire time in '{command}' command");
    let ms = n.checked_mul(unit_ms).ok_or_else(invalid)?;
    let at = if absolute {
        ms
    } else {
        (now_ms as i64).checked_add(ms).ok_or_else(invalid)?
    };
    Ok((at > now_ms as i64).then_some(at as u64))
}

/// SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]
fn set(args: Args<'_>, ctx: &mut Context<'_>, resp3: bool, out: &mut Vec<u8>) -> Result<(), String> {
    let (key, value) = (args.get(1), args.get(2));
    let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
    let mut expiry: Option<Option<u64>> = None;
    let syntax = || "ERR syntax error".to_string();
    let mut i = 3;
    while i < args.len() {
        let option = upper(args.get(i));
        match option.as_str() {
            "NX" if !xx => nx = true,
            "XX" if !nx => xx = true,
            "GET" => get = true,
            "KEEPTTL" if expiry.is_none() => keepttl = true,
            "EX" | "PX" | "EXAT" | "PXAT" if expiry.is_none() && !keepttl && i + 1 < args.len() => {
                let unit = if option.starts_with('E') { 1000 } else { 1 };
                let n = integer_arg(args.get(i + 1))?;
                if n <= 0 {
                    return Err("ERR invalid expire time in 'set' command".into());
                }
                expiry = Some(expiry_at(
                    args.get(i + 1),
                    unit,
                    option.ends_with("AT"),
                    ctx.now_ms,
                    "set",
                )?);
                i += 1;
            }
            _ => return Err(syntax()),
        }
        i += 1;
    }
    expire_if_due(ctx, key)?;
    let old = ctx.objects.get(key).map(|o| (o.value.clone(), o.expires_at_ms));
    let write = !(nx && old.is_some() || xx && old.is_none());
    if write {
        match expiry {
            // An absolute time already past: the key is set and expires
            // at once (Redis deletes it).
            Some(None) => {
                put(ctx, key, value, 0)?;
                delete_one(ctx, key)?;
            }
            Some(Some(at)) => put(ctx, key, value, at)?,
            None => put(
                ctx,
                key,
                value,
                if keepttl { old.as_ref().map_or(0, |o| o.1) } else { 0 },
            )?,
        }
    }
    match (get, old) {
        (true, Some((v, _))) => reply::bulk(out, &v),
        (true, None) => reply::null_in(out, resp3),
        (false, _) if write => reply::simple(out, "OK"),
        (false, _) => reply::null_in(out, resp3),
    }
    Ok(())
}

/// EXPIRE / PEXPIRE / EXPIREAT / PEXPIREAT key time [NX|XX|GT|LT]:
/// whether the expiry was set.
fn expire(name: &str, args: Args<'_>, ctx: &mut Context<'_>) -> Result<bool, String> {
    let key = args.get(1);
    let unit = if name.starts_with('p') { 1 } else { 1000 };
    let at = expiry_at(args.get(2), unit, name.ends_with("at"), ctx.now_ms, name)?;
    let mut condition = None;
    for i in 3..args.len() {
        let c = upper(args.get(i));
        if !matches!(c.as_str(), "NX" | "XX" | "GT" | "LT") || condition.is_some() {
            return Err(format!(
                "ERR Unsupported option {}",
                String::from_utf8_lossy(args.get(i))
            ));
        }
        condition = Some(c);
    }
    expire_if_due(ctx, key)?;
    let Some(current) = ctx.objects.get(key).map(|o| o.expires_at_ms) else {
        return Ok(false);
    };
    // No expiry counts as infinite for GT and LT, as in Redis.
    let new = at.unwrap_or(0);
    let allowed = match condition.as_deref() {
        None => true,
        Some("NX") => current == 0,
        Some("XX") => current != 0,
        Some("GT") => current != 0 && new > current,
        Some(_) => current == 0 || new < current,
    };
    if !allowed {
        return Ok(false);
    }
    match at {
        Some(at) => set_expiry(ctx, key, at)?,
        None => delete_one(ctx, key)?,
    }
    Ok(true)
}

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]
fn scan(args: Args<'_>, ctx: &mut Context<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let cursor = std::str::from_utf8(args.get(1))
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or("ERR invalid cursor")?;
    let (mut pattern, mut count, mut type_ok) = (None, 10usize, true);
    let mut i = 2;
    while i < args.len() {
        if i + 1 >= args.len() {
            return Err("ERR syntax error".into());
        }
        match upper(args.get(i)).as_str() {
            "MATCH" => pattern = Some(args.get(i + 1)),
            "COUNT" => {
                count = integer_arg(args.get(i + 1))?
                    .try_into()
                    .ok()
                    .filter(|c| *c > 0)
                    .ok_or("ERR syntax error")?
            }
            "TYPE" => type_ok = args.get(i + 1).eq_ignore_ascii_case(b"string"),
            _ => return Err("ERR syntax error".into()),
        }
        i += 2;
    }
    let (now, objects) = (ctx.now_ms, &*ctx.objects);
    let (keys, next) = scan_step(objects.keys(), objects.len(), cursor, count);
    let keys: Vec<&[u8]> = keys
        .into_iter()
        .filter(|k| type_ok && objects.get_live(k, now).is_some() && pattern.is_none_or(|p| glob_match(p, k)))
        .collect();
    reply::array_header(out, 2);
    reply::bulk(out, next.to_string().as_bytes());
    reply::array_header(out, keys.len());
    for k in keys {
        reply::bulk(out, k);
    }
    Ok(())
}

/// AUTH [user] password: Spindle has no passwords (see the module docs).
fn auth(user: &[u8], _password: &[u8], password_only: bool) -> Result<(), String> {
    if password_only {
        return Err("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?".into());
    }
    if user != b"default" {
        return Err("WRONGPASS invalid username-password pair or user is disabled.".into());
    }
    Ok(())
}

/// HELLO [protover [AUTH user password] [SETNAME name]]
fn hello(args: Args<'_>, session: &mut Session, out: &mut Vec<u8>) -> Result<(), String> {
    let mut resp3 = session.resp3;
    if args.len() >= 2 {
        resp3 = match args.get(1) {
            b"2" => false,
            b"3" => true,
            v if crate::resp::parse_i64(v).is_some() => return Err("NOPROTO unsupported protocol version".into()),
            _ => return Err("ERR Protocol version is not an integer or out of range".into()),
        };
    }
    let mut name = None;
    let mut i = 2;
    while i < args.len() {
        match upper(args.get(i)).as_str() {
            "AUTH" if i + 2 < args.len() => {
                auth(args.get(i + 1), args.get(i + 2), false)?;
                i += 3;
            }
            "SETNAME" if i + 1 < args.len() => {
                name = Some(client_name(args.get(i + 1))?);
                i += 2;
            }
            _ => {
                return Err(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(args.get(i))
                ))
            }
        }
    }
    session.resp3 = resp3;
    if let Some(n) = name {
        session.name = Some(n);
    }
    reply::map_header(out, 7, resp3);
    reply::bulk(out, b"server");
    reply::bulk(out, b"spindle");
    reply::bulk(out, b"version");
    reply::bulk(out, REDIS_COMPAT_VERSION.as_bytes());
    reply::bulk(out, b"proto");
    reply::integer(out, if resp3 { 3 } else { 2 });
    reply::bulk(out, b"id");
    reply::integer(out, session.id as i64);
    reply::bulk(out, b"mode");
    reply::bulk(out, b"standalone");
    reply::bulk(out, b"role");
    reply::bulk(out, b"master");
    reply::bulk(out, b"modules");
    reply::array_header(out, 0);
    Ok(())
}

/// The Redis version whose replies the implemented commands follow.
pub const REDIS_COMPAT_VERSION: &str = "7.0.0";

fn client_name(name: &[u8]) -> Result<Box<[u8]>, String> {
    if name.iter().any(|b| *b <= b' ' || *b > b'~') {
        return Err("ERR Client names cannot contain spaces, newlines or special characters.".into());
    }
    Ok(name.into())
}

/// CLIENT ID | SETNAME | GETNAME | SETINFO | INFO | NO-EVICT | NO-TOUCH
fn client(args: Args<'_>, session: &mut Session, out: &mut Vec<u8>) -> Result<(), String> {
    let sub = upper(args.get(1));
    let argc = args.len();
    match (sub.as_str(), argc) {
        ("ID", 2) => reply::integer(out, session.id as i64),
        ("SETNAME", 3) => {
            let name = args.get(2);
            session.name = if name.is_empty() {
                None
            } else {
                Some(client_name(name)?)
            };
            reply::simple(out, "OK");
        }
        ("GETNAME", 2) => match &session.name {
            Some(n) => reply::bulk(out, n),
            None => reply::null_in(out, session.resp3),
        },
        ("SETINFO", 4) => {
            let attr = upper(args.get(2));
            if !matches!(attr.as_str(), "LIB-NAME" | "LIB-VER") {
                return Err(format!(
                    "ERR Unrecognized option '{}'",
                    String::from_utf8_lossy(args.get(2))
                ));
            }
            let value = String::from_utf8_lossy(args.get(3));
            if value.chars().any(|c| c <= ' ' || c > '~') {
                return Err("ERR lib-name and lib-ver cannot contain spaces, newlines or special characters.".into());
            }
            session.lib = Some(format!("{}={value}", attr.to_ascii_lowercase()));
            reply::simple(out, "OK");
        }
        ("INFO", 2) => {
            let name = session.name.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
            let text = format!(
                "id={} name={name} db=0 resp={} {}\n",
                session.id,
                if session.resp3 { 3 } else { 2 },
                session.lib.as_deref().unwrap_or("")
            );
            reply::verbatim(out, text.as_bytes(), session.resp3);
        }
        ("NO-EVICT" | "NO-TOUCH", 3) => reply::simple(out, "OK"),
        _ => {
            return Err(format!(
                "ERR unknown subcommand or wrong number of arguments for '{}'. Try CLIENT HELP.",
                String::from_utf8_lossy(args.get(1))
            ))
        }
    }
    Ok(())
}

/// COMMAND [COUNT | LIST | INFO name… | DOCS [name…]]
fn command(args: Args<'_>, resp3: bool, out: &mut Vec<u8>) -> Result<(), String> {
    let sub = if args.len() >= 2 {
        upper(args.get(1))
    } else {
        String::new()
    };
    match sub.as_str() {
        "" => {
            reply::array_header(out, COMMANDS.len());
            for c in COMMANDS {
                command_entry(c, resp3, out);
            }
        }
        "COUNT" => reply::integer(out, COMMANDS.len() as i64),
        "LIST" => {
            reply::array_header(out, COMMANDS.len());
            for c in COMMANDS {
                reply::bulk(out, c.name.as_bytes());
            }
        }
        "INFO" => {
            reply::array_header(out, args.len() - 2);
            for i in 2..args.len() {
                match lookup(args.get(i)) {
                    Some(c) => command_entry(c, resp3, out),
                    None => reply::null_in(out, resp3),
                }
            }
        }
        // Documentation (redis-cli's hints) is not kept: an empty map.
        "DOCS" => reply::map_header(out, 0, resp3),
        _ => {
            return Err(format!(
                "ERR unknown subcommand '{}'. Try COMMAND HELP.",
                String::from_utf8_lossy(args.get(1))
            ))
        }
    }
    Ok(())
}

/// One `COMMAND` entry in the Redis 7 shape: name, arity, flags, first
/// key, last key, step, ACL categories, tips, key specs, subcommands.
fn command_entry(c: &crate::keyspace::CommandSpec, resp3: bool, out: &mut Vec<u8>) {
    reply::array_header(out, 10);
    reply::bulk(out, c.name.as_bytes());
    reply::integer(out, c.arity as i64);
    reply::set_header(out, c.flags.len(), resp3);
    for f in c.flags {
        reply::simple(out, f);
    }
    reply::integer(out, c.first_key as i64);
    reply::integer(out, c.last_key as i64);
    reply::integer(out, c.step as i64);
    for _ in 0..4 {
        reply::array_header(out, 0);
    }
}

/// CONFIG GET pattern…: no Redis configuration parameters are kept (an
/// empty reply, which redis-benchmark accepts); anything else is an error.
fn config(args: Args<'_>, resp3: bool, out: &mut Vec<u8>) -> Result<(), String> {
    match upper(args.get(1)).as_str() {
        "GET" if args.len() >= 3 => reply::map_header(out, 0, resp3),
        "RESETSTAT" if args.len() == 2 => reply::simple(out, "OK"),
        _ => {
            return Err(format!(
                "ERR CONFIG {} is not supported by Spindle (only CONFIG GET, which returns nothing; the service is configured by its file)",
                String::from_utf8_lossy(args.get(1))
            ))
        }
    }
    Ok(())
}

/// MSET is atomic: one batch of records, applied once the last is
/// acknowledged; recovery drops a batch that is not complete.
fn mset(args: Args<'_>, ctx: &mut Context<'_>) -> Result<(), String> {
    let pairs = (args.len() - 1) / 2;
    let mut added = 0usize;
    for i in 0..pairs {
        let (key, value) = (args.get(1 + 2 * i), args.get(2 + 2 * i));
        check_key(key)?;
        if value.len() > ctx.limits.value_bytes_max {
            return Err(format!(
                "ERR value of {} bytes is larger than value_bytes_max {}",
                value.len(),
                ctx.limits.value_bytes_max
            ));
        }
        added += key.len() + value.len() + crate::store::OBJECT_OVERHEAD_BYTES;
    }
    if ctx.objects.bytes() + added > ctx.objects.bytes_max() {
        return Err("OOM command not allowed when used memory > 'maxmemory'".into());
    }
    let base = ctx.objects.next_version();
    for i in 0..pairs {
        let rest = (pairs - 1 - i) as u32;
        ctx.log
            .append(
                RecordKind::Put,
                args.get(1 + 2 * i),
                args.get(2 + 2 * i),
                base + i as u64,
                rest,
            )
            .map_err(replication_failed)?;
    }
    for i in 0..pairs {
        ctx.objects
            .put(args.get(1 + 2 * i), args.get(2 + 2 * i), base + i as u64);
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

/// INCRBY and friends: the key's expiry is kept.
fn incr_by(ctx: &mut Context<'_>, key: &[u8], delta: i64) -> Result<i64, String> {
    expire_if_due(ctx, key)?;
    let (current, ttl) = match ctx.objects.get(key) {
        None => (0i64, 0),
        Some(o) => (
            crate::resp::parse_i64(&o.value).ok_or("ERR value is not an integer or out of range")?,
            o.expires_at_ms,
        ),
    };
    let next = current
        .checked_add(delta)
        .ok_or("ERR increment or decrement would overflow")?;
    let mut text = [0u8; 24];
    let len = {
        use std::io::Write;
        let mut cursor = std::io::Cursor::new(&mut text[..]);
        write!(cursor, "{next}").expect("an i64 fits 24 bytes");
        cursor.position() as usize
    };
    put(ctx, key, &text[..len], ttl)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{parse_request, Limits};
    use crate::store::ObjectMap;

    type Logged = (RecordKind, Vec<u8>, Vec<u8>, u64, u32);

    #[derive(Default)]
    struct Recorder(Vec<Logged>);
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
            self.0.push((kind, key.to_vec(), value.to_vec(), version, rest));
            Ok(())
        }
    }

    /// A master under test: its objects, its log, a session and a clock.
    struct Master {
        objects: ObjectMap,
        log: Recorder,
        session: Session,
        now_ms: u64,
    }

    impl Master {
        fn new() -> Master {
            Master {
                objects: ObjectMap::new(1 << 20),
                log: Recorder::default(),
                session: Session {
                    id: 7,
                    ..Session::default()
                },
                now_ms: 1_000_000,
            }
        }

        fn run(&mut self, request: &str) -> String {
            let mut ranges = Vec::new();
            let buf = request.as_bytes();
            parse_request(buf, &Limits::for_values(1 << 20), &mut ranges)
                .unwrap()
                .unwrap();
            let mut out = Vec::new();
            let limits = CommandLimits {
                value_bytes_max: 1 << 20,
            };
            let mut ctx = Context {
                objects: &mut self.objects,
                log: &mut self.log,
                limits: &limits,
                info: &|_| "x".into(),
                now_ms: self.now_ms,
            };
            execute(Args { buf, ranges: &ranges }, &mut ctx, &mut self.session, &mut out);
            String::from_utf8(out).unwrap()
        }

        /// What a backup would hold: the log replayed into a fresh map.
        fn replayed(&self) -> ObjectMap {
            let mut m = ObjectMap::new(1 << 20);
            for (kind, key, value, version, rest) in &self.log.0 {
                let r = crate::record::Record {
                    kind: *kind,
                    epoch: 1,
                    position: 0,
                    version: *version,
                    key,
                    value,
                    batch_rest: *rest,
                };
                m.apply_record(&r).unwrap();
            }
            m
        }
    }

    #[test]
    fn a_session() {
        let mut m = Master::new();
        assert_eq!(m.run("PING\r\n"), "+PONG\r\n");
        assert_eq!(m.run("SET a 1\r\n"), "+OK\r\n");
        assert_eq!(m.run("INCR a\r\n"), ":2\r\n");
        assert_eq!(m.run("GET a\r\n"), "$1\r\n2\r\n");
        assert_eq!(m.run("MSET b x c y\r\n"), "+OK\r\n");
        assert_eq!(m.run("MGET a nope c\r\n"), "*3\r\n$1\r\n2\r\n$-1\r\n$1\r\ny\r\n");
        assert_eq!(m.run("EXISTS a b nope\r\n"), ":2\r\n");
        assert_eq!(m.run("DEL a nope\r\n"), ":1\r\n");
        assert_eq!(m.run("DBSIZE\r\n"), ":2\r\n");
        assert_eq!(m.run("INCR b\r\n"), "-ERR value is not an integer or out of range\r\n");
        assert_eq!(m.log.0.len(), 5, "SET, INCR, 2 × MSET, DEL are logged; reads are not");
        let versions: Vec<u64> = m.log.0.iter().map(|r| r.3).collect();
        assert!(
            versions.windows(2).all(|w| w[0] < w[1]),
            "versions increase: {versions:?}"
        );
    }

    #[test]
    fn string_commands_follow_redis() {
        let mut m = Master::new();
        assert_eq!(m.run("APPEND s ab\r\n"), ":2\r\n");
        assert_eq!(m.run("APPEND s cd\r\n"), ":4\r\n");
        assert_eq!(m.run("STRLEN s\r\n"), ":4\r\n");
        assert_eq!(m.run("STRLEN nope\r\n"), ":0\r\n");
        assert_eq!(m.run("GETSET s new\r\n"), "$4\r\nabcd\r\n");
        assert_eq!(m.run("GETSET fresh v\r\n"), "$-1\r\n");
        assert_eq!(m.run("SETNX s x\r\n"), ":0\r\n");
        assert_eq!(m.run("SETNX t x\r\n"), ":1\r\n");
        assert_eq!(m.run("SET s y NX\r\n"), "$-1\r\n");
        assert_eq!(m.run("SET u y XX\r\n"), "$-1\r\n");
        assert_eq!(m.run("SET s y XX GET\r\n"), "$3\r\nnew\r\n");
        assert_eq!(m.run("SET s z NX XX\r\n"), "-ERR syntax error\r\n");
        assert_eq!(m.run("INCRBY n 10\r\n"), ":10\r\n");
        assert_eq!(m.run("DECRBY n 3\r\n"), ":7\r\n");
        assert_eq!(m.run("DECR n\r\n"), ":6\r\n");
        assert_eq!(
            m.run("INCRBY n x\r\n"),
            "-ERR value is not an integer or out of range\r\n"
        );
        assert_eq!(
            m.run("INCRBY n 9223372036854775807\r\n"),
            "-ERR increment or decrement would overflow\r\n"
        );
        assert_eq!(m.run("TYPE n\r\n"), "+string\r\n");
        assert_eq!(m.run("TYPE nope\r\n"), "+none\r\n");
        assert_eq!(m.run("UNLINK s t n nope\r\n"), ":3\r\n");
        assert_eq!(m.run("SELECT 0\r\n"), "+OK\r\n");
        assert_eq!(m.run("SELECT 1\r\n"), "-ERR DB index is out of range\r\n");
        assert_eq!(m.run("ECHO hi\r\n"), "$2\r\nhi\r\n");
        assert_eq!(m.run("FLUSHDB\r\n"), "+OK\r\n");
        assert_eq!(m.run("DBSIZE\r\n"), ":0\r\n");
        assert_eq!(m.replayed().len(), 0, "a backup replays the flush");
    }

    #[test]
    fn del_of_many_keys_is_one_batch() {
        let mut m = Master::new();
        m.run("MSET a 1 b 2 c 3\r\n");
        let before = m.log.0.len();
        assert_eq!(m.run("DEL a b nope c a\r\n"), ":3\r\n");
        let rests: Vec<u32> = m.log.0[before..].iter().map(|r| r.4).collect();
        assert_eq!(rests, [2, 1, 0], "one batch of three deletes");
    }

    /// The master decides expiry with its clock and writes it as data: the
    /// replayed log (a backup, a promoted backup) holds the same expiries,
    /// and an expired key is deleted by a delete record, never by a
    /// backup's clock.
    #[test]
    fn expiry_is_decided_by_the_master_and_replicated() {
        let mut m = Master::new();
        assert_eq!(m.run("SET k v EX 10\r\n"), "+OK\r\n");
        assert_eq!(m.run("TTL k\r\n"), ":10\r\n");
        assert_eq!(m.run("PTTL k\r\n"), ":10000\r\n");
        let (put, expire) = (&m.log.0[0], &m.log.0[1]);
        assert_eq!(
            (put.0, put.4, expire.0, expire.4),
            (RecordKind::Put, 1, RecordKind::Expire, 0),
            "one batch"
        );
        assert_eq!(
            m.replayed().get(b"k").unwrap().expires_at_ms,
            1_010_000,
            "absolute time in the log"
        );
        assert_eq!(m.run("SET p v PX 500\r\n"), "+OK\r\n");
        assert_eq!(m.run("SET q v\r\n"), "+OK\r\n");
        assert_eq!(m.run("EXPIRE q 100\r\n"), ":1\r\n");
        assert_eq!(m.run("EXPIRE q 50 GT\r\n"), ":0\r\n");
        assert_eq!(m.run("EXPIRE q 50 LT\r\n"), ":1\r\n");
        assert_eq!(m.run("EXPIRE nope 50\r\n"), ":0\r\n");
        assert_eq!(m.run("INCR q\r\n"), "-ERR value is not an integer or out of range\r\n");
        assert_eq!(m.run("SET n 1 EX 100\r\n"), "+OK\r\n");
        assert_eq!(m.run("INCRBY n 2\r\n"), ":3\r\n");
        assert_eq!(m.run("TTL n\r\n"), ":100\r\n", "INCR keeps the expiry");
        assert_eq!(m.run("APPEND n 0\r\n"), ":2\r\n");
        assert_eq!(m.run("TTL n\r\n"), ":100\r\n", "APPEND keeps the expiry");
        assert_eq!(m.run("SET n 5 KEEPTTL\r\n"), "+OK\r\n");
        assert_eq!(m.run("TTL n\r\n"), ":100\r\n", "SET KEEPTTL keeps it");
        assert_eq!(m.run("SET n 6\r\n"), "+OK\r\n");
        assert_eq!(m.run("TTL n\r\n"), ":-1\r\n", "SET clears it");
        assert_eq!(m.run("TTL nope\r\n"), ":-2\r\n");
        assert_eq!(m.run("PEXPIRE n 2000\r\n"), ":1\r\n");
        assert_eq!(m.run("PERSIST n\r\n"), ":1\r\n");
        assert_eq!(m.run("PERSIST n\r\n"), ":0\r\n");
        let replayed = m.replayed();
        for key in [&b"k"[..], b"p", b"q", b"n"] {
            assert_eq!(
                replayed.get(key).map(|o| o.expires_at_ms),
                m.objects.get(key).map(|o| o.expires_at_ms),
                "a backup holds the master's expiry of {key:?}"
            );
        }
        // Time passes on the master: p (500 ms) is due. The next command
        // deletes it with a delete record; a backup replays that.
        m.now_ms += 600;
        let logged = m.log.0.len();
        assert_eq!(m.run("GET p\r\n"), "$-1\r\n");
        assert_eq!(m.log.0[logged].0, RecordKind::Delete);
        assert!(
            m.replayed().get(b"p").is_none(),
            "the expiry reached the backup as a delete"
        );
        // k (10 s) and q (50 s): a promoted backup holds them until the
        // master's time says so; the sweep deletes due keys at any command.
        m.now_ms += 60_000;
        assert_eq!(m.run("PING\r\n"), "+PONG\r\n");
        assert_eq!(
            m.objects.len(),
            1,
            "the sweep deleted k and q: {:?}",
            m.objects.keys().collect::<Vec<_>>()
        );
        assert_eq!(m.replayed().len(), 1);
        assert_eq!(m.run("EXPIRE n -1\r\n"), ":1\r\n", "a past expiry deletes");
        assert_eq!(m.run("EXISTS n\r\n"), ":0\r\n");
        assert_eq!(
            m.run("SET x 1 EX 0\r\n"),
            "-ERR invalid expire time in 'set' command\r\n"
        );
        assert_eq!(m.run("SET x 1 EX 1 PX 1\r\n"), "-ERR syntax error\r\n");
    }

    #[test]
    fn keys_and_scan() {
        let mut m = Master::new();
        for i in 0..50 {
            m.run(&format!("SET user:{i} x\r\n"));
        }
        m.run("SET other x\r\n");
        m.run("SET gone x PX 10\r\n");
        m.now_ms += 20;
        let keys = m.run("KEYS user:1*\r\n");
        assert!(keys.starts_with("*11\r\n"), "user:1 and user:10..19: {keys}");
        assert_eq!(m.run("KEYS nothing*\r\n"), "*0\r\n");
        let mut cursor = "0".to_string();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            let reply = m.run(&format!("SCAN {cursor} MATCH user:* COUNT 7\r\n"));
            let lines: Vec<&str> = reply.split("\r\n").collect();
            assert_eq!(lines[0], "*2");
            cursor = lines[2].to_string();
            seen.extend(
                lines[4..]
                    .iter()
                    .filter(|l| l.starts_with("user:"))
                    .map(|l| l.to_string()),
            );
            if cursor == "0" {
                break;
            }
        }
        assert_eq!(
            (cursor.as_str(), seen.len()),
            ("0", 50),
            "every user key once, then cursor 0"
        );
        assert_eq!(m.run("SCAN x\r\n"), "-ERR invalid cursor\r\n");
    }

    #[test]
    fn hello_switches_to_resp3_and_client_commands() {
        let mut m = Master::new();
        let hello2 = m.run("HELLO\r\n");
        assert!(
            hello2.starts_with("*14\r\n$6\r\nserver\r\n$7\r\nspindle\r\n"),
            "{hello2}"
        );
        assert!(hello2.contains("$5\r\nproto\r\n:2\r\n"), "{hello2}");
        assert_eq!(m.run("GET nope\r\n"), "$-1\r\n");
        let hello3 = m.run("HELLO 3 AUTH default whatever SETNAME app\r\n");
        assert!(hello3.starts_with("%7\r\n"), "{hello3}");
        assert!(hello3.contains("$2\r\nid\r\n:7\r\n"), "{hello3}");
        assert_eq!(m.run("GET nope\r\n"), "_\r\n", "RESP3 null");
        assert_eq!(m.run("MGET nope\r\n"), "*1\r\n_\r\n");
        assert_eq!(m.run("CLIENT GETNAME\r\n"), "$3\r\napp\r\n");
        assert_eq!(m.run("CLIENT SETNAME other\r\n"), "+OK\r\n");
        assert_eq!(m.run("CLIENT ID\r\n"), ":7\r\n");
        assert_eq!(m.run("CLIENT SETINFO lib-name redis-py\r\n"), "+OK\r\n");
        assert_eq!(m.run("CLIENT SETINFO LIB-VER 8.1.0\r\n"), "+OK\r\n");
        assert!(m
            .run("CLIENT SETINFO colour red\r\n")
            .starts_with("-ERR Unrecognized option"));
        assert!(m.run("HELLO 4\r\n").starts_with("-NOPROTO"));
        assert!(m.run("HELLO 3 AUTH admin pw\r\n").starts_with("-WRONGPASS"));
        assert!(m
            .run("AUTH pw\r\n")
            .starts_with("-ERR AUTH <password> called without any password"));
        assert_eq!(m.run("AUTH default pw\r\n"), "+OK\r\n");
        assert_eq!(m.run("HELLO 2\r\n").split("\r\n").next(), Some("*14"));
        assert_eq!(m.run("GET nope\r\n"), "$-1\r\n", "back to RESP2");
        let count = m.run("COMMAND COUNT\r\n");
        assert_eq!(count, format!(":{}\r\n", COMMANDS.len()));
        assert!(m
            .run("COMMAND\r\n")
            .starts_with(&format!("*{}\r\n*10\r\n$6\r\nappend\r\n:3\r\n", COMMANDS.len())));
        assert_eq!(
            m.run("COMMAND INFO get lpush\r\n")
                .split("\r\n")
                .take(3)
                .collect::<Vec<_>>(),
            ["*2", "*10", "$3"]
        );
        assert_eq!(m.run("COMMAND DOCS\r\n"), "*0\r\n");
        assert_eq!(m.run("CONFIG GET save\r\n"), "*0\r\n");
    }

    #[test]
    fn errors_are_resp_errors() {
        let mut m = Master::new();
        assert_eq!(
            m.run("LPUSH now\r\n"),
            "-ERR unknown command 'LPUSH', with args beginning with: 'now'\r\n"
        );
        assert_eq!(m.run("GET\r\n"), "-ERR wrong number of arguments for 'get' command\r\n");
        assert_eq!(
            m.run("MSET a 1 b\r\n"),
            "-ERR wrong number of arguments for 'mset' command\r\n"
        );
        assert_eq!(m.run("QUIT\r\n"), "+OK\r\n");
        let mut small = Master::new();
        small.objects = ObjectMap::new(100);
        assert!(small
            .run("SET k 0123456789012345678901234567890123456789\r\n")
            .starts_with("-OOM"));
    }
}
