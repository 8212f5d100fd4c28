//! The point-to-point query channel (`spindle_group::query`) over the
//! deterministic sim fabric. Each seed draws 2 to 5 members, push
//! delays, split pushes and sometimes a crash. Every member asks random
//! members random requests, up to a full box. After every step these
//! properties are checked:
//!
//! - **reply integrity**: a reply is the answer to its own request, from
//!   the member asked: the answerer's function of (answerer, asker,
//!   target, request). A request starting with `!` is refused, and the
//!   refusal's reason names it.
//! - **no duplication, no loss**: the answerer answers each query once,
//!   and the asker takes one reply per query.
//! - **liveness** (after the drain): every query to a running member has
//!   its reply. A query to a crashed member is reported as gone.

use std::sync::Arc;

use spindle_fabric::sim::{SimFabric, SimOptions, SimRng, SimWorld};
use spindle_group::query::{QueryChannel, QueryError, QueryLayout, QueryTarget, QUERY_PAYLOAD_BYTES_MAX};

const SEEDS: u64 = 400;
const STEPS: u64 = 400;
const DRAIN_STEPS_MAX: u64 = 2_000;

/// What `answerer` replies to `asker`'s `request` for `target` (with
/// `sabotage`, one byte of every 50th reply of a run is flipped).
fn answer(answerer: usize, asker: usize, target: QueryTarget, request: &[u8], reply: &mut Vec<u8>) {
    reply.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(request).to_le_bytes());
    reply.extend_from_slice(&[answerer as u8, asker as u8]);
    reply.extend_from_slice(&target.subgroup.to_le_bytes());
    reply.extend_from_slice(&target.shard.to_le_bytes());
    let room = QUERY_PAYLOAD_BYTES_MAX - reply.len();
    reply.extend(request.iter().rev().take(room));
}

struct Pending {
    target: QueryTarget,
    request: Vec<u8>,
}

#[derive(Debug, Default)]
struct Totals {
    queries: u64,
    refused: u64,
    gone: u64,
    full_boxes: u64,
    crashes: u64,
}

fn run(seed: u64, sabotage: bool, totals: &mut Totals) -> Result<(), String> {
    let mut rng = SimRng::new(seed);
    let n = rng.range(2, 5) as usize;
    let mut options = SimOptions::new(n, QueryLayout::new(n).row_len_bytes(), rng.next_u64());
    options.delay_ns_max = [0, 1_000, 50_000, 500_000][rng.below(4) as usize];
    options.split_chunks_max = rng.range(1, 4) as usize;
    options.detect_timeout_ns = 2_000_000;
    let world = SimWorld::new(options).map_err(|e| e.to_string())?;
    let mut channels: Vec<QueryChannel<SimFabric>> = (0..n)
        .map(|r| QueryChannel::new(Arc::new(world.open(r).expect("open"))).expect("channel"))
        .collect();
    let crash = rng
        .chance(300)
        .then(|| (rng.below(n as u64) as usize, rng.below(STEPS)));
    let mut crashed = vec![false; n];
    let mut pending: Vec<Vec<Option<Pending>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    let mut asked = vec![vec![0u64; n]; n];
    let mut taken = vec![vec![0u64; n]; n];
    let mut served = vec![vec![0u64; n]; n];
    let mut order: Vec<usize> = (0..n).collect();
    let mut reply = Vec::new();
    let mut expected = Vec::new();
    let mut replies_made = 0u64;
    let mut step = 0;
    while step < STEPS + DRAIN_STEPS_MAX {
        world.advance(rng.below(20_000) + 1);
        world.deliver_due();
        if crash.is_some_and(|(_, at)| at == step) {
            let r = crash.unwrap().0;
            world.crash(r);
            crashed[r] = true;
            totals.crashes += 1;
        }
        rng.shuffle(&mut order);
        for &m in &order {
            if crashed[m] {
                continue;
            }
            let answered = &mut served[m];
            let replies = &mut replies_made;
            channels[m]
                .serve(&mut |asker, target, request, out| {
                    answered[asker] += 1;
                    if request.first() == Some(&b'!') {
                        return Err(format!("request {} refused", request.len()));
                    }
                    answer(m, asker, target, request, out);
                    *replies += 1;
                    if sabotage && replies.is_multiple_of(50) {
                        out[0] ^= 1;
                    }
                    Ok(())
                })
                .map_err(|e| format!("member {m} serves: {e}"))?;
            for p in (0..n).filter(|p| *p != m) {
                let Some(q) = &pending[m][p] else { continue };
                let Some(result) = channels[m].take_reply(p, &mut reply) else {
                    continue;
                };
                taken[m][p] += 1;
                match result {
                    Ok(()) => {
                        expected.clear();
                        answer(p, m, q.target, &q.request, &mut expected);
                        if reply != expected {
                            return Err(format!(
                                "reply integrity: member {m}'s query #{} to member {p} got a reply of {} B that is not \
                                 the answer to its request of {} B",
                                taken[m][p],
                                reply.len(),
                                q.request.len()
                            ));
                        }
                    }
                    Err(QueryError::Refused { peer, reason }) if q.request.first() == Some(&b'!') => {
                        if peer != p || reason != format!("request {} refused", q.request.len()) {
                            return Err(format!(
                                "reply integrity: member {m} got refusal {reason:?} from {peer}"
                            ));
                        }
                        totals.refused += 1;
                    }
                    Err(e) => return Err(format!("member {m}'s query to member {p} failed: {e}")),
                }
                pending[m][p] = None;
            }
            if step < STEPS && rng.chance(300) {
                let p = rng.below(n as u64) as usize;
                if p == m || pending[m][p].is_some() {
                    continue;
                }
                let len = if rng.chance(100) {
                    totals.full_boxes += 1;
                    QUERY_PAYLOAD_BYTES_MAX
                } else {
                    rng.below(200) as usize
                };
                let mut request: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
                if rng.chance(100) && !request.is_empty() {
                    request[0] = b'!';
                } else if request.first() == Some(&b'!') {
                    request[0] = b'?';
                }
                let target = QueryTarget {
                    subgroup: rng.below(4) as u32,
                    shard: rng.below(4) as u32,
                };
                channels[m]
                    .ask(p, target, &request)
                    .map_err(|e| format!("member {m} asks {p}: {e}"))?;
                asked[m][p] += 1;
                totals.queries += 1;
                pending[m][p] = Some(Pending { target, request });
            }
        }
        // No duplication: an answerer never answers more than was asked.
        for a in 0..n {
            for b in 0..n {
                if served[b][a] > asked[a][b] || taken[a][b] > asked[a][b] {
                    return Err(format!(
                        "no duplication: member {a} asked member {b} {} queries; {} answered, {} replies taken",
                        asked[a][b], served[b][a], taken[a][b]
                    ));
                }
            }
        }
        let waiting = (0..n).any(|m| !crashed[m] && (0..n).any(|p| !crashed[p] && pending[m][p].is_some()));
        if step >= STEPS && !waiting {
            break;
        }
        step += 1;
    }
    // Liveness and no loss between running members; a query to a crashed
    // member is told it is gone (after the detection timeout).
    world.advance(10_000_000);
    for m in (0..n).filter(|m| !crashed[*m]) {
        for p in (0..n).filter(|p| *p != m) {
            if crashed[p] {
                if pending[m][p].is_some() {
                    if !channels[m].peer_gone(p) {
                        return Err(format!("liveness: member {m} is not told that member {p} crashed"));
                    }
                    totals.gone += 1;
                }
                continue;
            }
            if pending[m][p].is_some() || taken[m][p] != asked[m][p] || served[p][m] != asked[m][p] {
                return Err(format!(
                    "no loss: member {m} asked member {p} {} queries; {} answered, {} replies taken after the drain",
                    asked[m][p], served[p][m], taken[m][p]
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn every_query_gets_its_own_reply_once_over_delays_splits_and_crashes() {
    let mut totals = Totals::default();
    let failures: Vec<String> = (0..SEEDS)
        .filter_map(|seed| run(seed, false, &mut totals).err().map(|e| format!("seed {seed}: {e}")))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {SEEDS} seeds failed:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
    assert!(totals.queries > SEEDS * 50, "{totals:?}");
    assert!(
        totals.refused > 0 && totals.full_boxes > 0 && totals.crashes > 0 && totals.gone > 0,
        "{totals:?}"
    );
    eprintln!("{SEEDS} seeds: {totals:?}");
}

#[test]
fn a_wrong_reply_is_caught() {
    let mut totals = Totals::default();
    let caught = (0..20)
        .filter(|seed| run(*seed, true, &mut totals).is_err_and(|e| e.starts_with("reply integrity")))
        .count();
    assert!(
        caught >= 15,
        "a corrupted reply was caught in only {caught} of 20 seeds"
    );
}
