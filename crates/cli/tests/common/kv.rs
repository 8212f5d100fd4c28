//! What the end-to-end tests of `spindle kv serve` share: ports for the
//! service and its members, and raw RESP over a `TcpStream`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// A port for a service or one of its tcp members: below the kernel's
/// ephemeral range, distinct within this process, free now. `lane`
/// shifts where a test binary starts looking, so test binaries running
/// beside each other rarely try the same ports.
///
/// Not `bind(0)`: the port it returns is free only until it is dropped,
/// and it lies in the ephemeral range, where every outgoing connection
/// of this machine (these tests' clients, the tcp members dialling each
/// other, other tests running beside them) takes its source port. The
/// tcp tests used to run their members on `port + 1 …` next to such a
/// port: now and then a connection had taken one of them, that member
/// failed to bind and exited, the others gave up joining after their
/// 30 s join timeout and the test failed (`history_across_a_failover_is_
/// linearizable_tcp`, about 30 s into the run). Ports below the
/// ephemeral range are never handed out by the kernel.
pub fn reserve_port(lane: u16) -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|w| w.parse::<u16>().ok()))
        .unwrap_or(32768);
    let span = 8000u16.min(low - 1024);
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = (std::process::id() % span as u32) as u16;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed) + lane % span) % span;
        let port = low - span + offset;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {}..{low}", low - span)
}

/// A raw RESP connection.
pub struct Resp {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Resp {
    /// Connect to `127.0.0.1:port`, retrying for up to `connect_wait` (the
    /// service may still be starting); reads time out after `read_timeout`.
    pub fn connect(port: u16, read_timeout: Duration, connect_wait: Duration) -> Resp {
        let started = Instant::now();
        loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(stream) => {
                    stream.set_read_timeout(Some(read_timeout)).unwrap();
                    return Resp {
                        stream,
                        buf: Vec::new(),
                    };
                }
                Err(e) if started.elapsed() > connect_wait => panic!("connect: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Send one command.
    pub fn send(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        send_requests(&mut self.stream, &[args])
    }

    /// Send several commands as one pipeline.
    pub fn send_pipeline(&mut self, requests: &[&[&[u8]]]) -> std::io::Result<()> {
        send_requests(&mut self.stream, requests)
    }

    /// One reply, as text (see [`parse_reply`]).
    pub fn reply(&mut self) -> std::io::Result<String> {
        read_reply(&mut self.stream, &mut self.buf)
    }

    /// Send one command and read its reply.
    pub fn call(&mut self, args: &[&str]) -> std::io::Result<String> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.send(&args)?;
        self.reply()
    }
}

/// Write `requests` (each a command and its arguments) as one pipeline.
pub fn send_requests(stream: &mut TcpStream, requests: &[&[&[u8]]]) -> std::io::Result<()> {
    let mut out = Vec::new();
    for args in requests {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in *args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
    }
    stream.write_all(&out)
}

/// Read one reply, as text (see [`parse_reply`]); `buf` keeps what was
/// read beyond it for the next call.
pub fn read_reply(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<String> {
    loop {
        if let Some((text, used)) = parse_reply(buf) {
            buf.drain(..used);
            return Ok(text);
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// One RESP2 reply at the head of `b` and the bytes it takes, or `None`
/// if incomplete: a simple string, error or integer as `+…`/`-…`/`:…`, a
/// bulk string as its text, a null as `nil`, an array flattened as
/// `[a,b,nil]`, anything else as `?…`.
pub fn parse_reply(b: &[u8]) -> Option<(String, usize)> {
    let line_end = b.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&b[1..line_end]).ok()?;
    let after = line_end + 2;
    match b.first()? {
        b'+' | b'-' | b':' => Some((format!("{}{line}", b[0] as char), after)),
        b'$' => {
            let len: i64 = line.parse().ok()?;
            if len < 0 {
                return Some(("nil".into(), after));
            }
            let end = after + len as usize;
            if b.len() < end + 2 {
                return None;
            }
            Some((String::from_utf8_lossy(&b[after..end]).into_owned(), end + 2))
        }
        b'*' => {
            let n: usize = line.parse().ok()?;
            let mut at = after;
            let mut items = Vec::new();
            for _ in 0..n {
                let (item, used) = parse_reply(&b[at..])?;
                items.push(item);
                at += used;
            }
            Some((format!("[{}]", items.join(",")), at))
        }
        _ => Some((format!("?{line}"), after)),
    }
}
