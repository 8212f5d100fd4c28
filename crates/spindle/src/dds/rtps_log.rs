//! Malformed RTPS datagrams, counted. rustdds parses the datagrams of its
//! UDP sockets and drops what it cannot parse with a `log` record and no
//! counter of its own: a datagram shorter than the RTPS header, one whose
//! first four bytes are not `RTPS`, and one whose header or a submessage
//! fails to parse (`RTPS deserialize error`), each dropped whole. When
//! the first RTPS participant of a process starts, Spindle installs a
//! `log` logger that counts those records ([`malformed_datagrams`]) and
//! prints one line to stderr for the first few and then at most one a
//! second, with the count so far. Other rustdds records are not printed.
//!
//! A process has one `log` logger: if the application installed its own
//! before, Spindle's is not installed, rustdds's records go to the
//! application's logger, and [`malformed_datagrams`] reports `None`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

use spindle_runtime::monotonic_coarse_ns;

/// The rustdds module that receives and parses datagrams (its `log` target).
const RECEIVER_TARGET: &str = "rustdds::rtps::message_receiver";
/// The beginnings of rustdds's records for a datagram it dropped unparsed.
const MALFORMED_PREFIXES: [&str; 3] = [
    "Message is shorter than RTPS header",
    "Received message with unknown start of header",
    "RTPS deserialize error",
];
/// Lines printed before the rate limit applies.
const LINES_FIRST: u64 = 3;
/// At most one line per this many nanoseconds after the first few.
const LINE_INTERVAL_NS: u64 = 1_000_000_000;

static MALFORMED: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
static LAST_LINE_NS: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

struct MalformedCounter;

static LOGGER: MalformedCounter = MalformedCounter;

impl log::Log for MalformedCounter {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn && metadata.target() == RECEIVER_TARGET
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // Formatted only on this path (a dropped datagram), never on the
        // send or delivery path.
        let text = record.args().to_string();
        if !MALFORMED_PREFIXES.iter().any(|p| text.starts_with(p)) {
            return;
        }
        // Relaxed: a monotone counter read for reporting.
        let n = MALFORMED.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= LINES_FIRST || line_due() {
            let shown: String = text.chars().take(160).collect();
            eprintln!("spindle rtps: dropped a malformed RTPS datagram ({shown}); {n} dropped so far");
        }
    }

    fn flush(&self) {}
}

/// Whether a second passed since the last rate-limited line (and claim it).
fn line_due() -> bool {
    let now = monotonic_coarse_ns();
    // Relaxed: the time stamp guards only how often a line is printed.
    let last = LAST_LINE_NS.load(Ordering::Relaxed);
    now.saturating_sub(last) >= LINE_INTERVAL_NS
        && LAST_LINE_NS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// Install the counting logger (once per process; a no-op when the
/// application has its own `log` logger).
pub(crate) fn install() {
    INSTALL.call_once(|| {
        if log::set_logger(&LOGGER).is_ok() {
            log::set_max_level(log::LevelFilter::Warn);
            // Release: pairs with the Acquire load in `malformed_datagrams`.
            INSTALLED.store(true, Ordering::Release);
        }
    });
}

/// RTPS datagrams this process's RTPS participants dropped as malformed
/// (see the module docs), or `None` when the application's own `log`
/// logger receives rustdds's records instead of Spindle's.
pub fn malformed_datagrams() -> Option<u64> {
    // Acquire: pairs with the Release store in `install`.
    INSTALLED
        .load(Ordering::Acquire)
        .then(|| MALFORMED.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(target: &str, level: log::Level, args: std::fmt::Arguments<'_>, f: impl FnOnce(&log::Record<'_>)) {
        f(&log::Record::builder().target(target).level(level).args(args).build());
    }

    #[test]
    fn the_three_drops_of_rustdds_count_and_nothing_else_does() {
        use log::Log;
        let before = MALFORMED.load(Ordering::Relaxed);
        let hit = |t: &str, l, a: std::fmt::Arguments<'_>| record(t, l, a, |r| LOGGER.log(r));
        hit(
            RECEIVER_TARGET,
            log::Level::Warn,
            format_args!("Message is shorter than RTPS header. Cannot deserialize."),
        );
        hit(
            RECEIVER_TARGET,
            log::Level::Warn,
            format_args!(
                "Received message with unknown start of header {:x?}. Ignoring.",
                [1u8, 2, 3, 4]
            ),
        );
        hit(
            RECEIVER_TARGET,
            log::Level::Warn,
            format_args!("RTPS deserialize error {:?}", "Invalid RTPS header"),
        );
        assert_eq!(MALFORMED.load(Ordering::Relaxed) - before, 3);
        // Other records of the receiver, other targets and lower levels do not count.
        hit(RECEIVER_TARGET, log::Level::Info, format_args!("Received RTPS PING."));
        hit(
            RECEIVER_TARGET,
            log::Level::Warn,
            format_args!("Cannot handle secure submessage"),
        );
        hit(
            "rustdds::rtps::writer",
            log::Level::Warn,
            format_args!("RTPS deserialize error x"),
        );
        hit(
            RECEIVER_TARGET,
            log::Level::Debug,
            format_args!("RTPS deserialize error x"),
        );
        assert_eq!(MALFORMED.load(Ordering::Relaxed) - before, 3);
    }
}
