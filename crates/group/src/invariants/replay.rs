//! Log checks: delivery logs replayed as a stream of events into the one
//! [`Checker`], which goes on to the end and reports the first broken
//! property in [`super::checker::REPORT_ORDER`].
//!
//! The members' logs are merged into one stream that keeps each member's
//! order and otherwise goes view by view (the next line is the one of
//! lowest view id among the members' next lines, the lowest member id on
//! a tie): every view's deliveries come before any member moves past it,
//! and the views turn up in id order, as they did in the run.

use std::collections::BTreeMap;

use super::checker::{Checker, Delivered, Event, Installed, Scope};
use super::{interleave, LogLine, Logs, MemberLines, ViewLogs, Violation};

/// Each member's lines in one stream (see the module docs); `Err` for a
/// view line in another member's log.
fn merged(lines: &MemberLines) -> Result<Vec<(usize, &LogLine)>, Violation> {
    for (member, member_lines) in lines {
        if let Some(v) = member_lines
            .iter()
            .find(|l| matches!(l, LogLine::View(v) if v.member != *member))
        {
            return Err(Violation::new(
                "view chain",
                format!("the view log of member {member} holds a line of member {}", v.member()),
            ));
        }
    }
    let mut heads: Vec<(usize, &[LogLine])> = lines.iter().map(|(m, l)| (*m, l.as_slice())).collect();
    let total: usize = heads.iter().map(|(_, l)| l.len()).sum();
    let mut out = Vec::with_capacity(total);
    for _ in 0..total {
        let next = heads
            .iter_mut()
            .filter(|(_, l)| !l.is_empty())
            .min_by_key(|(m, l)| (l[0].view(), *m))
            .expect("a line is left while fewer than all were taken");
        out.push((next.0, &next.1[0]));
        next.1 = &next.1[1..];
    }
    Ok(out)
}

/// Feed `lines` to `checker`, one event at a time: every member is added
/// first (tracked when its log has view lines). `stop_at_first`: return
/// the first violation as the simulator does (online); otherwise go on
/// and leave the violations in the checker. `Err` also for a line that is
/// not well formed (a view line in another member's log, an xxh3 that is
/// not hex).
pub(crate) fn feed(checker: &mut Checker, lines: &MemberLines, stop_at_first: bool) -> Result<(), Violation> {
    for (member, member_lines) in lines {
        let tracked = member_lines.iter().any(|l| matches!(l, LogLine::View(_)));
        checker.add_member(*member, tracked);
    }
    for (member, line) in merged(lines)? {
        let result = match line {
            LogLine::View(v) => checker.observe(&Event::View(Installed {
                member,
                view: v.view,
                members: &v.members,
                senders: None,
            })),
            LogLine::Left { member, .. } => {
                checker.on_leave(*member);
                Ok(())
            }
            LogLine::Delivery(e) => {
                let d = Delivered {
                    member,
                    ..Delivered::from_log_entry(e)?
                };
                checker.observe(&Event::Delivery(&d))
            }
        };
        if stop_at_first {
            result?;
        }
    }
    Ok(())
}

fn run(lines: &MemberLines, scope: Scope, expected: Option<&BTreeMap<usize, u64>>) -> Result<(), Violation> {
    let mut checker = Checker::new(scope);
    feed(&mut checker, lines, false)?;
    checker.finish(expected)
}

/// Check interleaved lines (as [`super::read_lines`] reads them): every
/// property but no gaps, total order when `ordered`.
pub fn check_lines(lines: &MemberLines, ordered: bool) -> Result<(), Violation> {
    let scope = Scope {
        total_order: ordered,
        survivors: true,
    };
    run(lines, scope, None)
}

/// [`check_lines`] without total order, on deliveries and view lines
/// apart (replayed as [`interleave`] puts them together).
pub fn check_views(logs: &Logs, views: &ViewLogs) -> Result<(), Violation> {
    check_lines(&interleave(logs, views), false)
}

/// Every property: total order when `ordered`, and no gaps with
/// `expected_per_sender` (how many messages each sender id sent) when
/// the logs show no membership change (after a view change, messages of
/// the old view beyond the ragged edge are never delivered, so counts per
/// sender say nothing; no loss and virtual synchrony take over).
pub fn check_all_views(
    logs: &Logs,
    views: &ViewLogs,
    expected_per_sender: &BTreeMap<usize, u64>,
    ordered: bool,
) -> Result<(), Violation> {
    let scope = Scope {
        total_order: ordered,
        survivors: true,
    };
    run(&interleave(logs, views), scope, Some(expected_per_sender))
}

/// [`check_all_views`] on logs without view lines.
pub fn check_all(logs: &Logs, expected_per_sender: &BTreeMap<usize, u64>, ordered: bool) -> Result<(), Violation> {
    check_all_views(logs, &ViewLogs::new(), expected_per_sender, ordered)
}

/// For tests: the violation `lines` show, checked as a log and fed to
/// the checker online; both must name the same property.
#[cfg(test)]
pub(crate) fn both(lines: &MemberLines, ordered: bool) -> Option<Violation> {
    let log = check_lines(lines, ordered).err();
    let scope = Scope {
        total_order: ordered,
        survivors: true,
    };
    let mut checker = Checker::new(scope);
    let online = feed(&mut checker, lines, true).err();
    assert_eq!(
        log.as_ref().map(|v| v.property),
        online.as_ref().map(|v| v.property),
        "the log check and the online check disagree: {log:?} vs {online:?}"
    );
    log
}
