//! Per-member counters, kept in the member's own row (never pushed) so
//! that `spindle stat` reads them live from shared memory without the
//! member's cooperation. Each is a monotonic `u64`.

/// Counter ids are indices into this list; the ids are stable.
pub const COUNTER_NAMES: [&str; 27] = [
    "sent_msgs",           // 0 data messages committed by this member
    "sent_bytes",          // 1
    "nulls_sent",          // 2 null messages (counted one by one)
    "null_runs",           // 3 null headers (each carries a run)
    "publish_batches",     // 4 guard updates (sender batching)
    "publish_batch_slots", // 5 slots published in them
    "receive_batches",     // 6 receive passes that found messages (receiver batching)
    "received_msgs",       // 7 messages received, nulls counted
    "delivery_batches",    // 8 delivery passes that delivered (delivery batching)
    "delivered_msgs",      // 9 data messages delivered to the application
    "delivered_bytes",     // 10
    "parks",               // 11 idle-strategy parks on the doorbell
    "yields",              // 12 idle-strategy yields
    "backpressure",        // 13 sends refused because the window was full
    "steps",               // 14 progress passes
    "stable",              // 15 stability frontier last seen (a position)
    "views_installed",     // 16 view changes this member went through
    "trimmed_msgs",        // 17 messages received but beyond a ragged-edge cut (not delivered)
    "suspicions",          // 18 members this member suspected on its own
    "view",                // 19 the current view id
    "resent_msgs",         // 20 own messages trimmed by a ragged edge and published again in the next view
    "replayed_msgs",       // 21 persistent mode: history handed to the application at a restart
    "persisted_num",       // 22 persistent mode: the durable frontier last published (a position)
    "large_msgs",          // 23 large messages delivered (each also one of delivered_msgs)
    "large_msgs_cut", // 24 large messages dropped half-assembled: cut by a view change or abandoned by their sender
    "log_compactions", // 25 persistent mode: compactions of this member's log asked for (see persist)
    "snapshots_restored", // 26 persistent mode: a restart restored the snapshot its log was compacted to
];

pub const SENT_MSGS: usize = 0;
pub const SENT_BYTES: usize = 1;
pub const NULLS_SENT: usize = 2;
pub const NULL_RUNS: usize = 3;
pub const PUBLISH_BATCHES: usize = 4;
pub const PUBLISH_BATCH_SLOTS: usize = 5;
pub const RECEIVE_BATCHES: usize = 6;
pub const RECEIVED_MSGS: usize = 7;
pub const DELIVERY_BATCHES: usize = 8;
pub const DELIVERED_MSGS: usize = 9;
pub const DELIVERED_BYTES: usize = 10;
pub const PARKS: usize = 11;
pub const YIELDS: usize = 12;
pub const BACKPRESSURE: usize = 13;
pub const STEPS: usize = 14;
pub const STABLE: usize = 15;
pub const VIEWS_INSTALLED: usize = 16;
pub const TRIMMED_MSGS: usize = 17;
pub const SUSPICIONS: usize = 18;
pub const VIEW: usize = 19;
pub const RESENT_MSGS: usize = 20;
pub const REPLAYED_MSGS: usize = 21;
pub const PERSISTED_NUM: usize = 22;
pub const LARGE_MSGS: usize = 23;
pub const LARGE_MSGS_CUT: usize = 24;
pub const LOG_COMPACTIONS: usize = 25;
pub const SNAPSHOTS_RESTORED: usize = 26;

/// The progress loop's private copy, flushed to the row once per pass.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub values: [u64; COUNTER_NAMES.len()],
}

impl Counters {
    #[inline(always)]
    pub fn add(&mut self, id: usize, n: u64) {
        self.values[id] += n;
    }
}
