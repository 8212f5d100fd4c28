//! A counting global allocator for tests that check a path allocates
//! nothing ("no allocation on the send or delivery path"): a test binary
//! installs [`CountingAllocator`] as its `#[global_allocator]`, turns
//! counting on for the threads it watches ([`count_this_thread`]), or for
//! every thread but those it exempts ([`count_every_thread`]), runs
//! the path, and reads [`allocations`] and the first counted
//! allocation's backtrace ([`first_backtrace`]). Every call goes to the
//! system allocator unchanged.
//!
//! ```
//! use spindle_runtime::alloc_count::{self, CountingAllocator};
//!
//! #[global_allocator]
//! static ALLOCATOR: CountingAllocator = CountingAllocator;
//!
//! fn main() {
//!     alloc_count::reset();
//!     alloc_count::count_this_thread(true);
//!     let counted = std::hint::black_box(vec![7u8; 16]);
//!     alloc_count::count_this_thread(false);
//!     let not_counted = std::hint::black_box(vec![7u8; 16]);
//!     assert_eq!(alloc_count::allocations(), 1);
//!     assert!(alloc_count::first_backtrace().is_some());
//!     drop((counted, not_counted));
//! }
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// The system allocator, counting the allocations of the threads that
/// asked for it.
pub struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static COUNTING_EVERYWHERE: AtomicBool = AtomicBool::new(false);
/// The first counted allocation's backtrace (symbols resolved later,
/// outside the allocator).
static FIRST: Mutex<Option<Backtrace>> = Mutex::new(None);

thread_local! {
    /// This thread's allocations are counted (const-initialized: reading
    /// it allocates nothing and needs no destructor).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// This thread is never counted (see [`exempt_this_thread`]).
    static EXEMPT: Cell<bool> = const { Cell::new(false) };
}

/// Count (or stop counting) the calling thread's allocations.
pub fn count_this_thread(on: bool) {
    COUNTING.with(|c| c.set(on));
}

/// Count (or stop counting) every thread's allocations, for a window in
/// which the test's own threads allocate nothing either (a thread that
/// must allocate meanwhile calls [`exempt_this_thread`]).
pub fn count_every_thread(on: bool) {
    // Relaxed: a window boundary; the threads' own work orders nothing.
    COUNTING_EVERYWHERE.store(on, Ordering::Relaxed);
}

/// Never count the calling thread, even with [`count_every_thread`] on.
pub fn exempt_this_thread() {
    EXEMPT.with(|c| c.set(true));
}

/// Forget what was counted so far.
pub fn reset() {
    ALLOCATIONS.store(0, Ordering::Relaxed);
    if let Ok(mut first) = FIRST.lock() {
        *first = None;
    }
}

/// Allocations counted since the last [`reset`].
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// The backtrace of the first allocation counted since the last
/// [`reset`], resolved now (it allocates: call it with counting off).
pub fn first_backtrace() -> Option<String> {
    FIRST.lock().ok().and_then(|mut f| f.take()).map(|b| b.to_string())
}

fn counted() {
    let everywhere = COUNTING_EVERYWHERE.load(Ordering::Relaxed) && !EXEMPT.with(Cell::get);
    if everywhere || COUNTING.with(Cell::get) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // Capturing allocates: uncounted (exempt for the moment), and
        // only the first.
        let (was_counting, was_exempt) = (COUNTING.with(Cell::get), EXEMPT.with(Cell::get));
        COUNTING.with(|c| c.set(false));
        EXEMPT.with(|c| c.set(true));
        if let Ok(mut first) = FIRST.try_lock() {
            if first.is_none() {
                *first = Some(Backtrace::force_capture());
            }
        }
        COUNTING.with(|c| c.set(was_counting));
        EXEMPT.with(|c| c.set(was_exempt));
    }
}

// SAFETY: every call is passed to `System` unchanged. The counting reads
// and writes const-initialized thread-local `Cell`s (no lazy init, no
// destructor, no allocation) and atomics; once, with counting off, it
// takes a mutex with `try_lock` (never blocking) and captures a
// backtrace, whose own allocations re-enter this allocator uncounted.
// Nothing in it unwinds.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}
