//! [`DataWriter`]: writes samples in place into the participant's send
//! ring, paced by NAPA when it is reliable.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use spindle_dds::napa::{Napa, NapaConfig, NapaTrace};
use spindle_dds::qos::{QosPolicyId, Reliability, WriterQos};
use spindle_dds::types::{InstanceHandle, ReaderId, SampleKind, SampleMeta, TopicType, WriterId};
use spindle_dds::wire::{SampleHeader, SAMPLE_HEADER_BYTES};
use spindle_group::SendError;
use spindle_runtime::{monotonic_ns, pace_until, realtime_ns};

use super::participant::ParticipantShared;
use super::DdsError;
use crate::Sender;

/// The last part of a wait shorter than this is spent yielding (precise,
/// and the progress threads run meanwhile); the rest is slept.
const PACE_SPIN_NS: u64 = 200_000;
/// A writer behind its pacing clock may catch up by at most this many
/// samples back to back. Every sample of such a burst waits for the ones
/// before it: with K (10) of credit, 100 KB samples over tcp had a p50 of
/// 123-154 µs, with 2 of credit 71-82 µs at the same throughput (200 KB:
/// 360-661 against 172-313 µs; two alternated runs,
/// bench/results/dds-napa-experiments-2026-12-01.json).
const PACE_CREDIT_SAMPLES: u64 = 2;

/// What a writer knows about its matches and its sends.
#[derive(Clone, Debug, Default)]
pub struct WriterStatus {
    /// Readers matched now.
    pub matched_readers: usize,
    /// Readers of the topic whose requested QoS this writer does not
    /// offer, with the failing policies (never matched).
    pub incompatible_qos: Vec<(ReaderId, Vec<QosPolicyId>)>,
    /// Readers of the topic name with a different type (never matched).
    pub inconsistent_topic: Vec<(ReaderId, String)>,
    /// Samples written (data, dispose and unregister).
    pub samples_written: u64,
    /// Best-effort samples not sent because the window was full.
    pub samples_dropped: u64,
    /// Writes that found the window full and waited.
    pub writes_blocked: u64,
    /// NAPA's state (None: NAPA off).
    pub napa: Option<NapaTrace>,
}

struct WriteState {
    napa: Option<Napa>,
    seq: u64,
    /// When NAPA's pacing clock has the next sample due.
    next_due_ns: u64,
    /// The position after the last sample written (acknowledged when the
    /// ring's acknowledged positions reach it).
    end_position: u64,
}

#[derive(Default)]
struct Matches {
    readers: Vec<ReaderId>,
    incompatible: Vec<(ReaderId, Vec<QosPolicyId>)>,
    inconsistent: Vec<(ReaderId, String)>,
}

pub(crate) struct WriterShared {
    pub(crate) id: WriterId,
    #[allow(dead_code)]
    topic: String,
    pub(crate) qos: WriterQos,
    participant: Arc<ParticipantShared>,
    sender: Sender,
    state: Mutex<WriteState>,
    matches: Mutex<Matches>,
    matched_changed: Condvar,
    samples_written: AtomicU64,
    samples_dropped: AtomicU64,
    writes_blocked: AtomicU64,
}

impl WriterShared {
    pub(crate) fn new(
        id: WriterId,
        topic: String,
        qos: WriterQos,
        participant: Arc<ParticipantShared>,
        napa: Option<NapaConfig>,
        ack_every: u32,
    ) -> Result<WriterShared, DdsError> {
        let sender = participant.sender()?;
        let napa = match (&qos.reliability, napa) {
            (Reliability::Reliable { .. }, Some(mut cfg)) => {
                cfg.window_slots_max = sender.window_slots() as u32;
                cfg.ack_every = ack_every;
                Some(
                    Napa::new(cfg, qos.max_sample_bytes.min(participant.max_sample_bytes as u32))
                        .map_err(|e| DdsError::Config(format!("NAPA: {e}")))?,
                )
            }
            _ => None,
        };
        Ok(WriterShared {
            id,
            topic,
            qos,
            participant,
            sender,
            state: Mutex::new(WriteState {
                napa,
                seq: 0,
                next_due_ns: 0,
                end_position: 0,
            }),
            matches: Mutex::new(Matches::default()),
            matched_changed: Condvar::new(),
            samples_written: AtomicU64::new(0),
            samples_dropped: AtomicU64::new(0),
            writes_blocked: AtomicU64::new(0),
        })
    }

    pub(crate) fn reader_matched(&self, reader: ReaderId) {
        let mut m = self.matches.lock().expect("matches lock");
        if !m.readers.contains(&reader) {
            m.readers.push(reader);
        }
        self.matched_changed.notify_all();
    }

    pub(crate) fn reader_unmatched(&self, reader: ReaderId) {
        let mut m = self.matches.lock().expect("matches lock");
        m.readers.retain(|r| *r != reader);
        self.matched_changed.notify_all();
    }

    pub(crate) fn incompatible(&self, reader: ReaderId, policies: Vec<QosPolicyId>) {
        self.matches
            .lock()
            .expect("matches lock")
            .incompatible
            .push((reader, policies));
        self.matched_changed.notify_all();
    }

    pub(crate) fn inconsistent(&self, reader: ReaderId, why: String) {
        self.matches
            .lock()
            .expect("matches lock")
            .inconsistent
            .push((reader, why));
        self.matched_changed.notify_all();
    }

    /// Write one sample: pace (NAPA), reserve a slot (waiting out a full
    /// window up to `max_blocking_time` when reliable), serialize in
    /// place, commit.
    fn write_sample(
        &self,
        kind: SampleKind,
        instance: InstanceHandle,
        source_timestamp_ns: Option<u64>,
        encode: impl FnOnce(&mut [u8]) -> Result<usize, DdsError>,
    ) -> Result<(), DdsError> {
        let mut guard = self.state.lock().expect("writer lock");
        let st = &mut *guard;
        if let Some(napa) = st.napa.as_mut() {
            let now = monotonic_ns();
            napa.on_acked(self.sender.acknowledged_slots(), now);
            napa.step(now, self.sender.window_occupancy().min(u32::MAX as u64) as u32);
            // Pace against a virtual clock: each sample is due one gap
            // after the previous one was due (not after it was actually
            // sent), so a wake-up that comes late (a busy core) does not
            // lower the rate: the next samples catch up, with at most
            // PACE_CREDIT_SAMPLES of credit (a burst of K, the ack group,
            // queued each of its samples behind the others).
            let gap_ns = match napa.gap_ns() {
                // A gap shorter than a paced wait costs on this transport
                // (participant::pace_gap_ns_min) cannot be spent: not paced
                // (small samples go at the window's pace, where batching is
                // what helps).
                gap if gap < self.participant.pace_gap_ns_min => 0,
                gap => gap,
            };
            let earliest_ns = now.saturating_sub(gap_ns.saturating_mul(PACE_CREDIT_SAMPLES));
            let due_ns = st.next_due_ns.max(earliest_ns);
            if due_ns > now {
                pace_until(due_ns, PACE_SPIN_NS);
            }
            st.next_due_ns = due_ns.saturating_add(gap_ns);
        }
        let reserve_bytes = SAMPLE_HEADER_BYTES + self.qos.max_sample_bytes as usize;
        let mut waited_since: Option<Instant> = None;
        let mut spins = 0u32;
        let mut slot = loop {
            match self.sender.reserve(reserve_bytes) {
                Ok(slot) => break slot,
                Err(SendError::WouldBlock) => match self.qos.reliability {
                    Reliability::BestEffort => {
                        self.samples_dropped.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    Reliability::Reliable { max_blocking_time_ns } => {
                        let since = *waited_since.get_or_insert_with(|| {
                            self.writes_blocked.fetch_add(1, Ordering::Relaxed);
                            Instant::now()
                        });
                        if since.elapsed().as_nanos() as u64 >= max_blocking_time_ns {
                            return Err(DdsError::Timeout {
                                waiting_for: format!(
                                    "room in the send window ({} slots unacknowledged: a matched reader is not keeping up or stopped reading); the sample was not written",
                                    self.sender.window_occupancy()
                                ),
                                waited_ms: max_blocking_time_ns / 1_000_000,
                            });
                        }
                        self.participant.check_running()?;
                        // Back off: spin, then yield, then sleep briefly.
                        spins += 1;
                        if spins < 64 {
                            std::hint::spin_loop();
                        } else if spins < 256 {
                            std::thread::yield_now();
                        } else {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                },
                Err(SendError::Stopped) => {
                    self.participant.check_running()?;
                    return Err(DdsError::Stopped("the group stopped sending".into()));
                }
                Err(e) => return Err(DdsError::Group(e.into())),
            }
        };
        let payload = slot.payload_mut();
        // An encoding error drops the slot uncommitted: the ring publishes
        // an empty skip slot, nothing reaches a reader.
        let value_bytes = encode(&mut payload[SAMPLE_HEADER_BYTES..])?;
        st.seq += 1;
        let meta = SampleMeta {
            writer: self.id,
            seq: st.seq,
            // Stamped when the sample enters the window (after NAPA's
            // pacing, if the caller gave no time): one-way latency is
            // send → deliver, as in the seed's measurements.
            source_timestamp_ns: source_timestamp_ns.unwrap_or_else(realtime_ns),
            instance,
            kind,
            strength: self.qos.ownership_strength,
        };
        SampleHeader::new(&meta, value_bytes as u32, None).write_to(payload);
        let position = slot.position();
        // NAPA's send time is taken before the commit: a writer descheduled
        // right after it must not see its sample acknowledged "before" it
        // was sent (an RTT sample of nothing that would shrink W). Without
        // NAPA nothing reads it: no clock read (it was a third of a small
        // sample's write).
        let sent_ns = st.napa.is_some().then(monotonic_ns);
        slot.commit_len(SAMPLE_HEADER_BYTES + value_bytes);
        self.sender.wake_progress();
        st.end_position = position + 1;
        if let (Some(napa), Some(sent_ns)) = (st.napa.as_mut(), sent_ns) {
            napa.on_sent(position + 1, sent_ns);
        }
        self.samples_written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Writes samples of `T` on a topic. Cheap to share across threads (the
/// writes of one writer are serialized: its sequence numbers follow the
/// order of its samples in the stream).
pub struct DataWriter<T> {
    shared: Arc<WriterShared>,
    _type: PhantomData<fn(&T)>,
}

impl<T: TopicType> DataWriter<T> {
    pub(crate) fn new(shared: Arc<WriterShared>) -> DataWriter<T> {
        DataWriter {
            shared,
            _type: PhantomData,
        }
    }

    /// This writer's id (the publication handle).
    pub fn id(&self) -> WriterId {
        self.shared.id
    }

    /// Publish a new value of its instance, stamped with the time it
    /// enters the send window. Never blocks unless the send window is full (reliable: waits up to `max_blocking_time`, then
    /// [`DdsError::Timeout`]; best-effort: the sample is dropped and
    /// counted) or NAPA paces it.
    pub fn write(&self, value: &T) -> Result<(), DdsError> {
        self.shared
            .write_sample(SampleKind::Data, value.instance(), None, |out| Ok(value.encode(out)?))
    }

    /// [`DataWriter::write`] with the source timestamp given (ns since the
    /// Unix epoch).
    pub fn write_at(&self, value: &T, source_timestamp_ns: u64) -> Result<(), DdsError> {
        self.shared
            .write_sample(SampleKind::Data, value.instance(), Some(source_timestamp_ns), |out| {
                Ok(value.encode(out)?)
            })
    }

    /// The instance of `key_holder` no longer exists (readers see
    /// `NotAliveDisposed`).
    pub fn dispose(&self, key_holder: &T) -> Result<(), DdsError> {
        self.shared
            .write_sample(SampleKind::Dispose, key_holder.instance(), None, |out| {
                Ok(key_holder.encode(out)?)
            })
    }

    /// This writer no longer writes the instance of `key_holder` (once no
    /// writer does, readers see `NotAliveNoWriters`).
    pub fn unregister(&self, key_holder: &T) -> Result<(), DdsError> {
        self.shared
            .write_sample(SampleKind::Unregister, key_holder.instance(), None, |out| {
                Ok(key_holder.encode(out)?)
            })
    }

    /// Readers matched now.
    pub fn matched_readers(&self) -> usize {
        self.shared.matches.lock().expect("matches lock").readers.len()
    }

    /// Wait until at least `n` readers match.
    pub fn wait_for_readers(&self, n: usize, timeout: Duration) -> Result<(), DdsError> {
        let deadline = Instant::now() + timeout;
        let mut m = self.shared.matches.lock().expect("matches lock");
        while m.readers.len() < n {
            self.shared.participant.check_running()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(DdsError::Timeout {
                    waiting_for: format!("{n} matched readers ({} so far)", m.readers.len()),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
            m = self
                .shared
                .matched_changed
                .wait_timeout(m, left.min(Duration::from_millis(50)))
                .expect("matches lock")
                .0;
        }
        Ok(())
    }

    /// Wait until every member acknowledged every sample written so far.
    pub fn wait_for_acknowledgments(&self, timeout: Duration) -> Result<(), DdsError> {
        let end = self.shared.state.lock().expect("writer lock").end_position;
        let deadline = Instant::now() + timeout;
        while self.shared.sender.acknowledged_slots() < end {
            self.shared.participant.check_running()?;
            if Instant::now() >= deadline {
                return Err(DdsError::Timeout {
                    waiting_for: format!(
                        "acknowledgments ({} of {} positions)",
                        self.shared.sender.acknowledged_slots(),
                        end
                    ),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// Matches, counters and NAPA's state.
    pub fn status(&self) -> WriterStatus {
        let m = self.shared.matches.lock().expect("matches lock");
        WriterStatus {
            matched_readers: m.readers.len(),
            incompatible_qos: m.incompatible.clone(),
            inconsistent_topic: m.inconsistent.clone(),
            samples_written: self.shared.samples_written.load(Ordering::Relaxed),
            samples_dropped: self.shared.samples_dropped.load(Ordering::Relaxed),
            writes_blocked: self.shared.writes_blocked.load(Ordering::Relaxed),
            napa: self
                .shared
                .state
                .lock()
                .expect("writer lock")
                .napa
                .as_ref()
                .map(|n| n.snapshot()),
        }
    }

    /// Send-window slots not yet acknowledged by every member.
    pub fn window_occupancy(&self) -> u64 {
        self.shared.sender.window_occupancy()
    }
}

impl<T> Drop for DataWriter<T> {
    fn drop(&mut self) {
        // Deleting a writer unregisters its instances at every reader.
        self.shared.participant.retire(self.shared.id.0);
    }
}
