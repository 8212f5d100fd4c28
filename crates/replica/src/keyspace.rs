//! Keyspace helpers of the Redis commands (sans-IO): the command table
//! (`COMMAND`, `INFO`, arity checks), glob patterns (`KEYS`, `SCAN
//! MATCH`) and the `SCAN` cursor.
//!
//! A `SCAN` cursor is a position in the order of the keys' 63-bit hashes:
//! a call returns the keys whose hash is at or above the cursor, smallest
//! hashes first, whole groups of equal hashes, and the next cursor is one
//! past the largest hash returned (0 at the end). Inserting or deleting
//! other keys never moves a key across the cursor, so every key present
//! for the whole scan is returned, as Redis promises; cursors work from
//! any connection.

use xxhash_rust::xxh3::xxh3_64;

/// One command the service implements, as `COMMAND` describes it
/// (Redis conventions: `arity` < 0 means at least `-arity` arguments,
/// the name included; keys at `first_key..=last_key` step `step`, a
/// negative `last_key` counts from the end).
#[derive(Clone, Copy, Debug)]
pub struct CommandSpec {
    pub name: &'static str,
    pub arity: i32,
    pub flags: &'static [&'static str],
    pub first_key: i32,
    pub last_key: i32,
    pub step: i32,
}

const fn spec(
    name: &'static str,
    arity: i32,
    flags: &'static [&'static str],
    first_key: i32,
    last_key: i32,
    step: i32,
) -> CommandSpec {
    CommandSpec {
        name,
        arity,
        flags,
        first_key,
        last_key,
        step,
    }
}

const FAST: &[&str] = &["fast"];
const READ: &[&str] = &["readonly", "fast"];
const READ_SLOW: &[&str] = &["readonly"];
const WRITE: &[&str] = &["write", "denyoom"];
const WRITE_FAST: &[&str] = &["write", "fast"];
const CONNECTION: &[&str] = &["noscript", "loading", "stale", "fast"];
const ADMIN: &[&str] = &["admin", "noscript", "loading", "stale"];

/// Every command the service implements, sorted by name.
pub const COMMANDS: &[CommandSpec] = &[
    spec("append", 3, WRITE, 1, 1, 1),
    spec("auth", -2, CONNECTION, 0, 0, 0),
    spec("client", -2, CONNECTION, 0, 0, 0),
    spec("command", -1, &["loading", "stale"], 0, 0, 0),
    spec("config", -2, ADMIN, 0, 0, 0),
    spec("dbsize", 1, READ, 0, 0, 0),
    spec("decr", 2, WRITE, 1, 1, 1),
    spec("decrby", 3, WRITE, 1, 1, 1),
    spec("del", -2, &["write"], 1, -1, 1),
    spec("echo", 2, FAST, 0, 0, 0),
    spec("exists", -2, READ, 1, -1, 1),
    spec("expire", -3, WRITE_FAST, 1, 1, 1),
    spec("expireat", -3, WRITE_FAST, 1, 1, 1),
    spec("flushall", -1, &["write"], 0, 0, 0),
    spec("flushdb", -1, &["write"], 0, 0, 0),
    spec("get", 2, READ, 1, 1, 1),
    spec("getset", 3, WRITE, 1, 1, 1),
    spec("hello", -1, CONNECTION, 0, 0, 0),
    spec("incr", 2, WRITE, 1, 1, 1),
    spec("incrby", 3, WRITE, 1, 1, 1),
    spec("info", -1, &["loading", "stale"], 0, 0, 0),
    spec("keys", 2, READ_SLOW, 0, 0, 0),
    spec("mget", -2, READ, 1, -1, 1),
    spec("mset", -3, WRITE, 1, -1, 2),
    spec("persist", 2, WRITE_FAST, 1, 1, 1),
    spec("pexpire", -3, WRITE_FAST, 1, 1, 1),
    spec("pexpireat", -3, WRITE_FAST, 1, 1, 1),
    spec("ping", -1, FAST, 0, 0, 0),
    spec("pttl", 2, READ, 1, 1, 1),
    spec("quit", -1, FAST, 0, 0, 0),
    spec("scan", -2, READ_SLOW, 0, 0, 0),
    spec("select", 2, &["loading", "stale", "fast"], 0, 0, 0),
    spec("set", -3, WRITE, 1, 1, 1),
    spec("setnx", 3, WRITE, 1, 1, 1),
    spec("strlen", 2, READ, 1, 1, 1),
    spec("ttl", 2, READ, 1, 1, 1),
    spec("type", 2, READ, 1, 1, 1),
    spec("unlink", -2, WRITE_FAST, 1, -1, 1),
];

/// The spec of `name` (any case), if the service implements it.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    // One integer key per name (its bytes, lowercased, big-endian in a
    // u128, zero-padded: the order of the keys is the order of the names),
    // searched as integers. Comparing through a lowercasing iterator chain
    // at every probe was 2.6-3.5% of the master's CPU under
    // redis-benchmark -P 16, and comparing slices (a memcmp call a probe)
    // about 7%; this is about 3%.
    if name.len() > COMMAND_NAME_BYTES_MAX {
        return None;
    }
    let mut bytes = [0u8; COMMAND_NAME_BYTES_MAX];
    bytes[..name.len()].copy_from_slice(name);
    bytes.make_ascii_lowercase();
    let i = COMMAND_KEYS.binary_search(&u128::from_be_bytes(bytes)).ok()?;
    // A name with a NUL byte has the key of its prefix: the lengths differ.
    (COMMANDS[i].name.len() == name.len()).then_some(&COMMANDS[i])
}

/// The longest command name (`COMMANDS`); a longer name is no command.
const COMMAND_NAME_BYTES_MAX: usize = 16;

/// `name`'s key for [`lookup`] (the names are lowercase already): the
/// same zero-padded big-endian bytes that `lookup` builds at run time.
const fn command_key(name: &[u8]) -> u128 {
    assert!(name.len() <= COMMAND_NAME_BYTES_MAX, "a command name fits its key");
    let mut bytes = [0u8; COMMAND_NAME_BYTES_MAX];
    let mut i = 0;
    while i < name.len() {
        bytes[i] = name[i];
        i += 1;
    }
    u128::from_be_bytes(bytes)
}

/// The keys of `COMMANDS`, in its (sorted) order.
static COMMAND_KEYS: [u128; COMMANDS.len()] = {
    let mut keys = [0u128; COMMANDS.len()];
    let mut i = 0;
    while i < COMMANDS.len() {
        keys[i] = command_key(COMMANDS[i].name.as_bytes());
        assert!(i == 0 || keys[i - 1] < keys[i], "the table is sorted: binary search");
        i += 1;
    }
    keys
};

/// Whether `argc` arguments (the name included) fit `spec`'s arity.
pub fn arity_ok(spec: &CommandSpec, argc: usize) -> bool {
    if spec.arity >= 0 {
        argc == spec.arity as usize
    } else {
        argc >= spec.arity.unsigned_abs() as usize
    }
}

/// The implemented commands, comma-separated (for `INFO`).
pub fn command_list() -> String {
    COMMANDS.iter().map(|c| c.name).collect::<Vec<_>>().join(",")
}

/// Redis glob matching (`*`, `?`, `[abc]`, `[^a-z]`, `\x`), as `KEYS`
/// and `SCAN MATCH` use it. Iterative (one backtrack point for the last
/// `*`): time O(pattern × subject), no recursion.
pub fn glob_match(pattern: &[u8], subject: &[u8]) -> bool {
    let (mut p, mut s) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while s < subject.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p, s));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    s += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class_match(pattern, p, subject[s]) {
                        if matched {
                            p = next;
                            s += 1;
                            continue;
                        }
                    }
                }
                b'\\' if p + 1 < pattern.len() && pattern[p + 1] == subject[s] => {
                    p += 2;
                    s += 1;
                    continue;
                }
                // An escape that does not match: a mismatch.
                b'\\' if p + 1 < pattern.len() => {}
                c if c == subject[s] => {
                    p += 1;
                    s += 1;
                    continue;
                }
                _ => {}
            }
        }
        // Mismatch: let the last `*` take one more byte, or fail.
        match star {
            Some((sp, ss)) => {
                p = sp + 1;
                s = ss + 1;
                star = Some((sp, ss + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

/// Match `c` against the class starting at `pattern[open] == '['`:
/// whether it matched and the index after the class; `None` for an
/// unterminated class (then `[` matches nothing, as in Redis it matches
/// up to the pattern's end, which no byte can satisfy consistently).
fn class_match(pattern: &[u8], open: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while i < pattern.len() {
        let b = pattern[i];
        if b == b']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if b == b'\\' && i + 1 < pattern.len() {
            matched |= pattern[i + 1] == c;
            i += 2;
        } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' && pattern[i + 2] != b']' {
            let (lo, hi) = (b.min(pattern[i + 2]), b.max(pattern[i + 2]));
            matched |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            matched |= b == c;
            i += 1;
        }
    }
    None
}

/// A key's place in the `SCAN` order: a 63-bit hash (so that one past the
/// largest is still a valid cursor).
pub fn scan_hash(key: &[u8]) -> u64 {
    xxh3_64(key) >> 1
}

/// One `SCAN` step over `keys`: up to about `count` keys whose
/// [`scan_hash`] is at least `cursor` (whole groups of equal hashes), in
/// hash order, and the next cursor (0: done). `count` is a hint, as in
/// Redis; a step returns at least `len / 64` keys so that a scan of any
/// store takes a bounded number of steps.
pub fn scan_step<'a>(
    keys: impl Iterator<Item = &'a [u8]>,
    len: usize,
    cursor: u64,
    count: usize,
) -> (Vec<&'a [u8]>, u64) {
    let batch = count.max(len / 64).max(1);
    let mut candidates: Vec<(u64, &'a [u8])> = keys.map(|k| (scan_hash(k), k)).filter(|(h, _)| *h >= cursor).collect();
    if candidates.len() <= batch {
        candidates.sort_unstable();
        return (candidates.into_iter().map(|(_, k)| k).collect(), 0);
    }
    candidates.select_nth_unstable(batch - 1);
    let boundary = candidates[batch - 1].0;
    // Whole groups of equal hashes: the boundary's group goes in whole.
    let mut taken: Vec<(u64, &'a [u8])> = candidates.into_iter().filter(|(h, _)| *h <= boundary).collect();
    taken.sort_unstable();
    assert!(boundary < u64::MAX >> 1 || taken.len() > batch, "scan: 63-bit hashes");
    (taken.into_iter().map(|(_, k)| k).collect(), boundary + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_found_in_any_case() {
        assert!(
            COMMANDS.windows(2).all(|w| w[0].name < w[1].name),
            "sorted for binary search"
        );
        assert_eq!(lookup(b"GeT").unwrap().name, "get");
        assert!(lookup(b"LPUSH").is_none());
        assert!(lookup(b"").is_none());
        assert!(
            lookup(&[b'g'; COMMAND_NAME_BYTES_MAX + 1]).is_none(),
            "too long for any command"
        );
        assert!(lookup(b"get\0").is_none() && lookup(b"ge").is_none() && lookup(b"gets").is_none());
        for spec in COMMANDS {
            assert_eq!(
                lookup(spec.name.to_ascii_uppercase().as_bytes()).unwrap().name,
                spec.name
            );
        }
        assert!(arity_ok(lookup(b"set").unwrap(), 5) && !arity_ok(lookup(b"set").unwrap(), 2));
        assert!(arity_ok(lookup(b"get").unwrap(), 2) && !arity_ok(lookup(b"get").unwrap(), 3));
    }

    #[test]
    fn globs_match_as_redis_does() {
        for (p, s, want) in [
            ("*", "", true),
            ("*", "abc", true),
            ("a*", "abc", true),
            ("a*c", "abbbc", true),
            ("a*c", "abbbd", false),
            ("h?llo", "hello", true),
            ("h?llo", "hllo", false),
            ("h[ae]llo", "hallo", true),
            ("h[ae]llo", "hillo", false),
            ("h[^e]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-c]llo", "hbllo", true),
            ("h[a-c]llo", "hdllo", false),
            ("h\\*llo", "h*llo", true),
            ("h\\*llo", "hello", false),
            ("*:*:x", "a:b:c:x", true),
            ("user:*", "user:", true),
            ("[", "[", false),
        ] {
            assert_eq!(glob_match(p.as_bytes(), s.as_bytes()), want, "'{p}' against '{s}'");
        }
    }

    #[test]
    fn a_scan_returns_every_key_present_throughout_despite_writes() {
        let mut keys: Vec<Vec<u8>> = (0..1000).map(|i| format!("k{i}").into_bytes()).collect();
        let mut seen = std::collections::HashSet::new();
        let mut cursor = 0u64;
        let mut steps = 0;
        loop {
            let (got, next) = scan_step(keys.iter().map(|k| &k[..]), keys.len(), cursor, 10);
            seen.extend(got.into_iter().map(|k| k.to_vec()));
            // Writes between steps: new keys, and deletes of keys added
            // during the scan (the first 1000 stay).
            keys.push(format!("new{steps}").into_bytes());
            if steps % 3 == 0 && keys.len() > 1000 {
                keys.remove(1000);
            }
            steps += 1;
            assert!(steps < 10_000, "a scan ends");
            if next == 0 {
                break;
            }
            assert!(next > cursor, "cursors increase");
            cursor = next;
        }
        for i in 0..1000 {
            assert!(seen.contains(format!("k{i}").as_bytes()), "k{i} missed by the scan");
        }
    }
}
