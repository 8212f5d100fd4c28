//! # spindle-replica — one-sided object replication (RAMCloud) and a RESP
//! key-value service
//!
//! A master appends object records (key, version, value, checksum) to a
//! log whose open segment lives in every backup's registered memory; it
//! writes each record straight into it with one-sided fabric writes and
//! acknowledges the write once the writes to all backups have completed
//! ([`master`]). Backups' CPUs stay off the write path: they flush closed
//! segments to disk in the background with fsync, holding a bounded ring
//! of segments in memory ([`backup`]). The same store runs with a
//! two-sided RPC baseline ([`master::Mode::Rpc`]) so the two can be
//! measured side by side, as in the RAMCloud seed. With
//! [`layout::Durability::Disk`] a write is acknowledged only once every
//! backup has it on disk: each backup's syncer writes and fdatasyncs what
//! arrived since its last round (group commit) and publishes how far its
//! disk reaches ([`backup`]).
//!
//! Every part is generic over the fabric: on shm a push is the
//! completion; on tcp one-sided writes complete by a backup's echo of the
//! guard ([`layout::Completion`]).
//!
//! When the master dies (or loses its majority), every backup seals its
//! log on disk; a backup elected by a majority ([`failover`]: a majority
//! elects, a lease fences the old master) replays its log into a new master (checksums verified, a
//! torn last record dropped: [`replay`]), the others become its backups in
//! a new epoch, and the service's address moves to it ([`node`],
//! [`server`]). A master also *rolls* to a new epoch on its own: to put a
//! spare in place of a dead backup (R copies again) and to clean its log
//! (each epoch starts with a snapshot of the live objects, and backups
//! delete older epochs once it is on disk). After every member stopped, a
//! start with the same data directory recovers from the newest log.
//!
//! The KV service ([`server`], [`command`]) speaks RESP2 and RESP3 (after
//! `HELLO 3`) with the Redis string commands that client libraries need
//! ([`keyspace::COMMANDS`]: GET, SET with its options, MSET — atomic: one
//! batch of records that recovery applies whole or not at all —, INCRBY,
//! APPEND, EXPIRE/TTL, SCAN, KEYS, HELLO, CLIENT, COMMAND …); anything else
//! is a RESP error. Expiry is decided by the master and replicated as
//! expire and delete records ([`record`]). Writes are applied to the objects only after every
//! backup has them, so a read never shows a write a failover could lose.
//!
//! Sans-IO parts (no threads, sockets or clocks): [`record`], [`log`],
//! [`replay`], [`store`], [`resp`], [`command`], [`keyspace`], [`linearizability`],
//! [`config`], the echo and disk-syncer steps ([`echo`], [`durable`]). Runtime parts: [`master`], [`backup`], [`disk`], [`node`],
//! [`server`].
#![deny(unsafe_op_in_unsafe_fn)]

pub mod backup;
pub mod command;
pub mod config;
pub mod disk;
pub mod driver;
pub mod durable;
pub mod echo;
pub mod failover;
pub mod failover_sim;
pub mod keyspace;
pub mod layout;
pub mod linearizability;
pub mod liveness;
pub mod log;
pub mod master;
pub mod node;
pub mod record;
pub mod replay;
pub mod resp;
pub mod server;
pub mod store;

pub use master::Mode;
