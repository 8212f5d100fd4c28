//! The RESP server (runtime): one thread per client, at most
//! `clients_max` clients, each request bounded by [`Limits`]; pipelined
//! requests are handled in batches (every complete request in what one
//! read brought, under one lock), with one write of all their replies.
//! A batch is one group commit: its appends do not wait one by one for
//! the backups' replies (rpc) or echoes (tcp); the server waits once,
//! still under the lock, before any reply of the batch is written, so no
//! client — this one or another — sees a write before every backup has
//! it. If that wait fails the master cannot tell which writes are
//! replicated: it exits, and a backup takes over from its log.
//! After each batch the leader's housekeeping runs under the same lock
//! ([`Leader::maintain`]: replacing dead backups, cleaning the log).
//! With a stop flag, a watcher thread stops the service cleanly when the
//! flag is set: it takes the lock (no write in flight), ends the epoch
//! with every backup's log sealed on disk, and exits the process.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::sync::atomic::AtomicBool;

use crate::command::{execute, Args, CommandLimits, Flow};
use crate::node::{Leader, Membership};
use crate::resp::{parse_request, reply, Limits};
use crate::store::ObjectMap;

/// Serving parameters.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub clients_max: usize,
    pub value_bytes_max: usize,
    /// Extra `INFO` lines (role, recovery …).
    pub info_extra: String,
    /// Stop cleanly (and exit the process) once this is set.
    pub stop: Option<&'static AtomicBool>,
}

/// Bind `addr`, retrying while the old master's socket lingers.
pub fn bind(addr: &str, wait: Duration) -> Result<TcpListener, String> {
    let started = std::time::Instant::now();
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && started.elapsed() < wait => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("bind {addr}: {e}")),
        }
    }
}

/// Serve clients forever (the process ends the service).
pub fn serve<F: Membership>(listener: TcpListener, leader: Leader<F>, options: ServeOptions) -> Result<(), String> {
    let store = Arc::new(Mutex::new(leader));
    if let Some(stop) = options.stop {
        let store = store.clone();
        std::thread::Builder::new()
            .name("kv-stop".into())
            .spawn(move || {
                // Partner: the Release store of the flag by the signal handler.
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let mut leader = store.lock().unwrap_or_else(|p| p.into_inner());
                let code = match leader.stop() {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("spindle kv: clean stop failed: {e}");
                        1
                    }
                };
                std::process::exit(code);
            })
            .map_err(|e| format!("start the stop watcher: {e}"))?;
    }
    let clients = Arc::new(AtomicUsize::new(0));
    let options = Arc::new(options);
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        if clients.fetch_add(1, Ordering::AcqRel) >= options.clients_max {
            clients.fetch_sub(1, Ordering::AcqRel);
            let _ = stream.write_all(b"-ERR max number of clients reached\r\n");
            continue;
        }
        let (store, clients, options) = (store.clone(), clients.clone(), options.clone());
        let spawned = std::thread::Builder::new().name("kv-client".into()).spawn(move || {
            let _ = handle_client(stream, &store, &options);
            clients.fetch_sub(1, Ordering::AcqRel);
        });
        if spawned.is_err() {
            // Out of threads: the client's stream was moved and dropped.
            continue;
        }
    }
    Ok(())
}

fn info_text(store_mode: &str, epoch: u64, backups: usize, head: u64, objects: &ObjectMap, extra: &str) -> String {
    format!(
        "# Server\r\nredis_version:7.0.0\r\nspindle_version:{}\r\n# Replication\r\nrole:master\r\nreplication_mode:{store_mode}\r\nepoch:{epoch}\r\nconnected_slaves:{backups}\r\nlog_head:{head}\r\n{extra}# Memory\r\nused_memory:{}\r\nmaxmemory:{}\r\n# Keyspace\r\ndb0:keys={},expires=0\r\n",
        env!("CARGO_PKG_VERSION"),
        objects.bytes(),
        objects.bytes_max(),
        objects.len()
    )
}

fn handle_client<F: Membership>(
    mut stream: TcpStream,
    store: &Mutex<Leader<F>>,
    options: &ServeOptions,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let limits = Limits::for_values(options.value_bytes_max);
    let command_limits = CommandLimits {
        value_bytes_max: options.value_bytes_max,
    };
    // A request is at most a few bulk strings over the value bound.
    let buffer_max = limits.bulk_bytes_max * 2 + 64 * 1024;
    let mut buf: Vec<u8> = vec![0; 16 * 1024];
    let mut filled = 0usize;
    let mut out: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut ranges = Vec::new();
    loop {
        if filled == buf.len() {
            if buf.len() >= buffer_max {
                reply::error(&mut out, "ERR Protocol error: request larger than the server's bound");
                stream.write_all(&out)?;
                return Ok(());
            }
            buf.resize((buf.len() * 2).min(buffer_max), 0);
        }
        let n = stream.read(&mut buf[filled..])?;
        if n == 0 {
            return Ok(());
        }
        filled += n;
        let mut used = 0;
        let mut close = false;
        {
            let mut guard = store.lock().unwrap_or_else(|p| p.into_inner());
            let leader = &mut *guard;
            leader.master.set_deferred(true);
            loop {
                let (master, objects) = (&mut leader.master, &mut leader.objects);
                match parse_request(&buf[used..filled], &limits, &mut ranges) {
                    Ok(None) => break,
                    Ok(Some(consumed)) => {
                        let args = Args {
                            buf: &buf[used..filled],
                            ranges: &ranges,
                        };
                        let mode = master.mode().as_str();
                        let (epoch, backups, head) = (master.epoch(), master.backups().len(), master.head());
                        let info = |o: &ObjectMap| info_text(mode, epoch, backups, head, o, &options.info_extra);
                        let flow = execute(args, objects, master, &command_limits, &info, &mut out);
                        used += consumed;
                        if flow == Flow::Close {
                            close = true;
                            break;
                        }
                    }
                    Err(e) => {
                        reply::error(&mut out, &format!("ERR {e}"));
                        close = true;
                        break;
                    }
                }
            }
            leader.master.set_deferred(false);
            if let Err(e) = leader.master.complete() {
                // Writes of this batch are applied to the objects but not
                // known to be replicated: nobody may see them. Exit with
                // the lock held; the backups fail over from their logs.
                eprintln!("spindle kv: replication failed, master exits: {e}");
                std::process::exit(70);
            }
            if let Err(e) = leader.maintain() {
                eprintln!("spindle kv: housekeeping failed: {e}");
            }
        }
        buf.copy_within(used..filled, 0);
        filled -= used;
        if !out.is_empty() {
            stream.write_all(&out)?;
            out.clear();
        }
        if close {
            return Ok(());
        }
    }
}
