//! [`DataReader`]: a reader's history, filled by the progress thread.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use spindle_dds::cache::{Insert, ReaderCache, SampleInfo, StateMask};
use spindle_dds::qos::{History, QosPolicyId, ReaderQos, Reliability};
use spindle_dds::types::{InstanceHandle, ReaderId, SampleMeta, TopicType, WriterId};

use super::participant::ParticipantShared;
use super::DdsError;

/// A sample as the application gets it: what the middleware knows, and
/// the value (None for a dispose or unregister: `info.valid_data` false).
#[derive(Clone, Debug)]
pub struct Sample<T> {
    /// States, timestamps, writer, sequence, instance.
    pub info: SampleInfo,
    /// The value.
    pub data: Option<T>,
}

/// What a reader knows about its matches, its history and its QoS.
#[derive(Clone, Debug, Default)]
pub struct ReaderStatus {
    /// Writers matched now.
    pub matched_writers: usize,
    /// Writers of the topic that do not offer what this reader requests
    /// (never matched), with the failing policies.
    pub incompatible_qos: Vec<(WriterId, Vec<QosPolicyId>)>,
    /// Writers of the topic name with a different type (never matched).
    pub inconsistent_topic: Vec<(WriterId, String)>,
    /// Writers whose liveliness was lost (their participant left the view
    /// or died).
    pub liveliness_lost: Vec<WriterId>,
    /// The history's counters: samples lost or rejected, deadlines
    /// missed, liveliness.
    pub cache: spindle_dds::cache::ReaderStatus,
}

struct CacheState {
    cache: ReaderCache,
    /// Samples accepted so far (what `wait_for_data` watches).
    accepted: u64,
    /// Threads in `wait_for_data` (a delivery wakes the condition
    /// variable only when one waits: a wake is a system call).
    waiters: u32,
}

#[derive(Default)]
struct Matches {
    writers: Vec<WriterId>,
    incompatible: Vec<(WriterId, Vec<QosPolicyId>)>,
    inconsistent: Vec<(WriterId, String)>,
    liveliness_lost: Vec<WriterId>,
}

type Listener = Box<dyn FnMut() + Send>;

pub(crate) struct ReaderShared {
    pub(crate) id: ReaderId,
    pub(crate) qos: ReaderQos,
    state: Mutex<CacheState>,
    data_available: Condvar,
    matches: Mutex<Matches>,
    listener: Mutex<Option<Listener>>,
    /// Whether a listener is set: the delivery path locks `listener`
    /// only then.
    has_listener: AtomicBool,
}

impl ReaderShared {
    pub(crate) fn new(id: ReaderId, qos: ReaderQos) -> ReaderShared {
        ReaderShared {
            id,
            state: Mutex::new(CacheState {
                cache: ReaderCache::new(&qos),
                accepted: 0,
                waiters: 0,
            }),
            qos,
            data_available: Condvar::new(),
            matches: Mutex::new(Matches::default()),
            listener: Mutex::new(None),
            has_listener: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_reliable_keep_all(&self) -> bool {
        matches!(self.qos.reliability, Reliability::Reliable { .. }) && self.qos.history == History::KeepAll
    }

    /// Samples the history can still take before it is full.
    pub(crate) fn free_samples(&self) -> usize {
        let len = self.state.lock().expect("reader lock").cache.len();
        (self.qos.resource_limits.max_samples as usize).saturating_sub(len)
    }

    /// Insert a delivered sample (progress thread).
    pub(crate) fn insert(&self, meta: &SampleMeta, value: &[u8], now_ns: u64) {
        let (accepted, waited) = {
            let mut st = self.state.lock().expect("reader lock");
            let outcome = st.cache.insert(meta, value, now_ns);
            let accepted = matches!(outcome, Insert::Accepted | Insert::AcceptedReplacedOldest);
            if accepted {
                st.accepted += 1;
            }
            (accepted, st.waiters > 0)
        };
        if accepted {
            if waited {
                self.data_available.notify_all();
            }
            // Relaxed: a listener set while this sample is inserted may
            // miss it, as one set just after would.
            if self.has_listener.load(Ordering::Relaxed) {
                if let Some(listener) = self.listener.lock().expect("listener lock").as_mut() {
                    listener();
                }
            }
        }
    }

    pub(crate) fn writer_matched(&self, writer: WriterId, strength: i32, lifespan_ns: Option<u64>, now_ns: u64) {
        {
            let mut st = self.state.lock().expect("reader lock");
            // False: more live writers than the history tracks; their
            // samples are rejected and counted (status: WritersLimit).
            let _tracked = st.cache.writer_matched(writer, strength, now_ns);
            st.cache.set_writer_lifespan(writer, lifespan_ns);
        }
        let mut m = self.matches.lock().expect("matches lock");
        if !m.writers.contains(&writer) {
            m.writers.push(writer);
        }
        drop(m);
        self.data_available.notify_all();
    }

    pub(crate) fn writer_lost(&self, writer: WriterId, liveliness_lost: bool, now_ns: u64) {
        {
            let mut st = self.state.lock().expect("reader lock");
            if liveliness_lost {
                st.cache.writer_lost(writer, now_ns);
            } else {
                st.cache.writer_removed(writer, now_ns);
            }
        }
        let mut m = self.matches.lock().expect("matches lock");
        m.writers.retain(|w| *w != writer);
        if liveliness_lost {
            m.liveliness_lost.push(writer);
        }
        drop(m);
        self.data_available.notify_all();
    }

    pub(crate) fn incompatible(&self, writer: WriterId, policies: Vec<QosPolicyId>) {
        self.matches
            .lock()
            .expect("matches lock")
            .incompatible
            .push((writer, policies));
        self.data_available.notify_all();
    }

    pub(crate) fn inconsistent(&self, writer: WriterId, why: String) {
        self.matches
            .lock()
            .expect("matches lock")
            .inconsistent
            .push((writer, why));
        self.data_available.notify_all();
    }

    /// Deadlines and lifespans (progress thread, every millisecond).
    pub(crate) fn tick(&self, now_ns: u64) {
        let mut st = self.state.lock().expect("reader lock");
        st.cache.check_deadlines(now_ns);
        st.cache.expire(now_ns);
    }

    pub(crate) fn wake_all(&self) {
        self.data_available.notify_all();
    }
}

/// Reads samples of `T` from a topic.
pub struct DataReader<T> {
    shared: Arc<ReaderShared>,
    participant: Arc<ParticipantShared>,
    /// `accepted` at the last read or take.
    seen: Mutex<u64>,
    _type: PhantomData<fn() -> T>,
}

impl<T: TopicType> DataReader<T> {
    pub(crate) fn new(shared: Arc<ReaderShared>, participant: Arc<ParticipantShared>) -> DataReader<T> {
        DataReader {
            shared,
            participant,
            seen: Mutex::new(0),
            _type: PhantomData,
        }
    }

    /// This reader's id (the subscription handle).
    pub fn id(&self) -> ReaderId {
        self.shared.id
    }

    fn collect(
        &self,
        max: usize,
        f: impl FnOnce(&mut ReaderCache, &mut dyn FnMut(&SampleInfo, &[u8])) -> usize,
    ) -> Result<Vec<Sample<T>>, DdsError> {
        self.collect_as(max, f, |sample, _| sample)
    }

    /// Remove and return up to `max` samples (every state), each with the
    /// length of its serialized bytes (an RTPS bridge counts the bytes it
    /// has in flight).
    #[cfg(feature = "rtps")]
    pub(crate) fn take_sized(&self, max: usize) -> Result<Vec<(Sample<T>, usize)>, DdsError> {
        self.collect_as(
            max,
            |c, f| c.take_with(max, StateMask::ANY, f),
            |sample, len| (sample, len),
        )
    }

    fn collect_as<R>(
        &self,
        max: usize,
        f: impl FnOnce(&mut ReaderCache, &mut dyn FnMut(&SampleInfo, &[u8])) -> usize,
        mut wrap: impl FnMut(Sample<T>, usize) -> R,
    ) -> Result<Vec<R>, DdsError> {
        let mut out = Vec::new();
        let mut error = None;
        let mut st = self.shared.state.lock().expect("reader lock");
        *self.seen.lock().expect("seen lock") = st.accepted;
        f(&mut st.cache, &mut |info: &SampleInfo, bytes: &[u8]| {
            let data = if info.valid_data {
                match T::decode(bytes) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        error.get_or_insert(e);
                        None
                    }
                }
            } else {
                None
            };
            if out.len() < max {
                out.push(wrap(Sample { info: *info, data }, bytes.len()));
            }
        });
        match error {
            Some(e) => Err(e.into()),
            None => Ok(out),
        }
    }

    /// Remove and return up to `max` samples (every state).
    pub fn take(&self, max: usize) -> Result<Vec<Sample<T>>, DdsError> {
        self.collect(max, |c, f| c.take_with(max, StateMask::ANY, f))
    }

    /// Return up to `max` samples, leaving them in the history (marked
    /// read).
    pub fn read(&self, max: usize) -> Result<Vec<Sample<T>>, DdsError> {
        self.collect(max, |c, f| c.read_with(max, StateMask::ANY, f))
    }

    /// Return up to `max` samples not read before, leaving them marked
    /// read.
    pub fn read_unread(&self, max: usize) -> Result<Vec<Sample<T>>, DdsError> {
        self.collect(max, |c, f| c.read_with(max, StateMask::NOT_READ, f))
    }

    /// Remove and return up to `max` samples of one instance.
    pub fn take_instance(&self, instance: InstanceHandle, max: usize) -> Result<Vec<Sample<T>>, DdsError> {
        self.collect(max, |c, f| c.take_instance_with(instance, max, f))
    }

    /// Take up to `max` samples without decoding or allocating: `f` gets
    /// each one's info and serialized bytes (valid during the call).
    pub fn take_raw(&self, max: usize, mut f: impl FnMut(&SampleInfo, &[u8])) -> usize {
        let mut st = self.shared.state.lock().expect("reader lock");
        *self.seen.lock().expect("seen lock") = st.accepted;
        st.cache.take_with(max, StateMask::ANY, &mut f)
    }

    /// Samples in the history now.
    pub fn len(&self) -> usize {
        self.shared.state.lock().expect("reader lock").cache.len()
    }

    /// Whether the history is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wait until a sample arrived since the last read or take (true), or
    /// `timeout` passed (false).
    pub fn wait_for_data(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let seen = *self.seen.lock().expect("seen lock");
        let mut st = self.shared.state.lock().expect("reader lock");
        let mut arrived = true;
        // Registered under the lock that `insert` reads it under: an
        // insert either sees this waiter or happened before the check.
        st.waiters += 1;
        while st.accepted == seen {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.participant.check_running().is_err() || left.is_zero() {
                arrived = false;
                break;
            }
            st = self
                .shared
                .data_available
                .wait_timeout(st, left.min(Duration::from_millis(50)))
                .expect("reader lock")
                .0;
        }
        st.waiters -= 1;
        arrived
    }

    /// Wait until at least `n` writers match.
    pub fn wait_for_writers(&self, n: usize, timeout: Duration) -> Result<(), DdsError> {
        let deadline = Instant::now() + timeout;
        loop {
            let have = self.shared.matches.lock().expect("matches lock").writers.len();
            if have >= n {
                return Ok(());
            }
            self.participant.check_running()?;
            if Instant::now() >= deadline {
                return Err(DdsError::Timeout {
                    waiting_for: format!("{n} matched writers ({have} so far)"),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Call `f` (on the participant's progress thread: keep it short,
    /// never block) each time a sample is accepted.
    pub fn on_data_available(&self, f: impl FnMut() + Send + 'static) {
        *self.shared.listener.lock().expect("listener lock") = Some(Box::new(f));
        self.shared.has_listener.store(true, Ordering::Relaxed);
    }

    /// Matches, history counters, deadlines missed, liveliness.
    pub fn status(&self) -> ReaderStatus {
        let m = self.shared.matches.lock().expect("matches lock");
        ReaderStatus {
            matched_writers: m.writers.len(),
            incompatible_qos: m.incompatible.clone(),
            inconsistent_topic: m.inconsistent.clone(),
            liveliness_lost: m.liveliness_lost.clone(),
            cache: self.shared.state.lock().expect("reader lock").cache.status(),
        }
    }
}

impl<T> Drop for DataReader<T> {
    fn drop(&mut self) {
        self.participant.retire(self.shared.id.0);
    }
}
