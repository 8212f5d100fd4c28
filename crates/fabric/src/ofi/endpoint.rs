//! Safe wrappers over `spindle-ofi-sys`: one RDM endpoint with its
//! completion queue and address vector, one memory registration, RMA
//! writes and completions. Every failure becomes a [`FabricError::Ofi`]
//! naming the operation (and the peer, where there is one).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::{self, NonNull};

use spindle_ofi_sys as sys;

use crate::FabricError;

/// Longest endpoint address Spindle exchanges (a sockaddr_in6 is 28 bytes;
/// verbs and EFA addresses are under 64).
pub const ADDR_BYTES_MAX: usize = 192;
/// Completions taken per read.
pub const COMPLETIONS_PER_READ: usize = 64;

/// Providers that grant `FI_ORDER_WAW` but were seen to break it here:
/// libfabric 1.17's `sockets` let a guard land before the data written
/// ahead of it (the conformance suite's ordering scenario). They are
/// opened unordered (each push waits for the previous write's delivery).
pub const PROVIDERS_BREAKING_ORDER: &[&str] = &["sockets"];

/// Providers whose writes to one peer are issued one at a time, each after
/// the previous one's completion: libfabric 1.17's `tcp` (through
/// `ofi_rxm`) grants `FI_ORDER_WAW`, yet with megabytes of writes in
/// flight to a peer a guard was seen to land before the 10 KB slot
/// written ahead of it (`tests/ofi_order.rs`). Its completion means the
/// bytes are in the connection's socket, behind which the next write
/// queues, so waiting for it restores the order, at the cost of one
/// write in flight per peer.
pub const PROVIDERS_SERIALIZED: &[&str] = &["tcp"];

/// libfabric's text for an error code.
pub fn strerror(code: i64) -> String {
    // SAFETY: fi_strerror accepts any code and returns a pointer to a
    // static NUL-terminated string (never null).
    let text = unsafe { CStr::from_ptr(sys::spof_strerror(code as c_int)) };
    format!("{} ({code})", text.to_string_lossy())
}

/// An error for operation `op` (with `peer` if it concerns one).
pub fn ofi_error(op: impl Into<String>, peer: Option<usize>, fault: impl Into<String>) -> FabricError {
    FabricError::Ofi {
        op: op.into(),
        peer: peer.map_or_else(String::new, |p| format!(" to member {p}")),
        fault: fault.into(),
    }
}

fn text(buf: &[c_char]) -> String {
    // SAFETY: the shim NUL-terminates what it writes, and the buffer was
    // zeroed, so a NUL is within it either way.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

/// The providers this machine's libfabric offers for RDM endpoints with
/// RMA writes (`fi_getinfo`), comma-separated.
pub fn providers() -> String {
    let mut buf = [0 as c_char; 512];
    // SAFETY: the buffer is valid for its length; the shim writes at most
    // that many bytes, NUL included.
    let found = unsafe { sys::spof_providers(buf.as_mut_ptr(), buf.len()) };
    match found {
        0 => "none".into(),
        n if n < 0 => format!("none (fi_getinfo: {})", strerror(n as i64)),
        _ => text(&buf),
    }
}

/// What the provider granted, decoded from the shim's flags.
#[derive(Clone, Copy, Debug)]
pub struct Granted {
    /// Writes to one peer land in issue order (`FI_ORDER_WAW`).
    pub ordered: bool,
    /// `spof_cq_sread` blocks on a wait object.
    pub waitable: bool,
    /// Remote addresses are virtual addresses, not region offsets.
    pub virt_addr: bool,
    /// Local buffers need the registration's descriptor.
    pub mr_local: bool,
    /// The provider picks registration keys.
    pub prov_key: bool,
    /// Issue one write per peer at a time ([`PROVIDERS_SERIALIZED`]).
    pub serialized: bool,
    /// A write's completion says its bytes are in the target's memory
    /// (`FI_DELIVERY_COMPLETE`), not only that they left.
    pub delivery_complete: bool,
}

/// An opened, enabled RDM endpoint (fabric, domain, CQ, AV, endpoint).
pub struct Endpoint {
    raw: NonNull<sys::spof_endpoint>,
    pub granted: Granted,
    pub max_write_bytes: usize,
    description: String,
}

// SAFETY: the endpoint is opened with FI_THREAD_SAFE, so libfabric allows
// every call on it from any thread at once; the handle is only freed in
// Drop, which has exclusive access.
unsafe impl Send for Endpoint {}
// SAFETY: as for Send (FI_THREAD_SAFE).
unsafe impl Sync for Endpoint {}

impl Endpoint {
    /// Open an endpoint of `provider` whose completion queue holds
    /// `cq_depth` entries; with `delivery_complete` every write completes
    /// only once it is in the target's memory. A provider that is not
    /// there (or cannot do RMA writes on RDM endpoints) fails with the
    /// list of those that can.
    pub fn open(provider: &str, cq_depth: usize, delivery_complete: bool) -> Result<Endpoint, FabricError> {
        let flags = if delivery_complete {
            sys::SPOF_OPEN_DELIVERY_COMPLETE
        } else {
            0
        };
        Endpoint::open_with(provider, cq_depth, flags)
    }

    /// As [`Endpoint::open`] (no delivery completion), with messages too:
    /// [`Endpoint::send`] and [`Endpoint::recv`], for two-sided baselines
    /// on the same provider as the one-sided path.
    pub fn open_messaging(provider: &str, cq_depth: usize) -> Result<Endpoint, FabricError> {
        Endpoint::open_with(provider, cq_depth, sys::SPOF_OPEN_MSG)
    }

    fn open_with(provider: &str, cq_depth: usize, open_flags: c_int) -> Result<Endpoint, FabricError> {
        let trust_order = !PROVIDERS_BREAKING_ORDER.contains(&provider);
        let name = CString::new(provider)
            .map_err(|_| FabricError::InvalidOption(format!("provider name {provider:?} contains a NUL byte")))?;
        let mut raw = ptr::null_mut();
        let mut err = [0 as c_char; 256];
        // SAFETY: `name` is a valid C string for the call; `raw` and `err`
        // are valid out-pointers of the sizes given.
        let ret = unsafe {
            sys::spof_open(
                name.as_ptr(),
                trust_order as c_int,
                open_flags,
                cq_depth,
                &mut raw,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        let Some(raw) = NonNull::new(raw).filter(|_| ret == 0) else {
            return Err(if ret == -sys::FI_ENODATA {
                FabricError::OfiProvider {
                    provider: provider.to_string(),
                    offered: providers(),
                }
            } else {
                ofi_error(format!("open a '{provider}' endpoint"), None, text(&err))
            });
        };
        // SAFETY: `raw` is the endpoint just opened.
        let flags = unsafe { sys::spof_flags(raw.as_ptr()) };
        // SAFETY: as above.
        let max_msg = unsafe { sys::spof_max_msg_size(raw.as_ptr()) };
        let mut desc = [0 as c_char; 256];
        // SAFETY: as above; the buffer is valid for its length.
        unsafe { sys::spof_describe(raw.as_ptr(), desc.as_mut_ptr(), desc.len()) };
        Ok(Endpoint {
            raw,
            granted: Granted {
                ordered: flags & sys::SPOF_ORDERED_WAW != 0,
                waitable: flags & sys::SPOF_WAITABLE != 0,
                virt_addr: flags & sys::SPOF_MR_VIRT_ADDR != 0,
                mr_local: flags & sys::SPOF_MR_LOCAL != 0,
                prov_key: flags & sys::SPOF_MR_PROV_KEY != 0,
                serialized: PROVIDERS_SERIALIZED.contains(&provider),
                delivery_complete: flags & sys::SPOF_DELIVERY_COMPLETE != 0,
            },
            max_write_bytes: usize::try_from(max_msg).unwrap_or(usize::MAX),
            description: text(&desc),
        })
    }

    /// "provider fabric domain".
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// This endpoint's address, for peers' address vectors.
    pub fn name(&self) -> Result<Vec<u8>, FabricError> {
        let mut addr = vec![0u8; ADDR_BYTES_MAX];
        let mut len = addr.len();
        // SAFETY: `addr` is valid for `len` bytes; the shim writes at most
        // `len` and stores the address's length in it.
        let ret = unsafe { sys::spof_getname(self.raw.as_ptr(), addr.as_mut_ptr() as *mut c_void, &mut len) };
        if ret != 0 {
            return Err(ofi_error(
                "fi_getname",
                None,
                format!(
                    "{} (address of {len} bytes, at most {ADDR_BYTES_MAX})",
                    strerror(ret as i64)
                ),
            ));
        }
        addr.truncate(len);
        Ok(addr)
    }

    /// Insert `peer`'s address; returns its `fi_addr_t`.
    pub fn insert(&self, peer: usize, addr: &[u8]) -> Result<u64, FabricError> {
        assert!(
            !addr.is_empty() && addr.len() <= ADDR_BYTES_MAX,
            "address length checked by the caller"
        );
        let mut fi_addr = 0u64;
        // SAFETY: `addr` holds an address of the length the provider's
        // format has (checked against its announced length by the caller;
        // the provider reads exactly that many bytes); `fi_addr` is a valid
        // out-pointer.
        let ret = unsafe { sys::spof_av_insert(self.raw.as_ptr(), addr.as_ptr() as *const c_void, &mut fi_addr) };
        if ret != 0 {
            return Err(ofi_error(
                "fi_av_insert (its address)",
                Some(peer),
                strerror(ret as i64),
            ));
        }
        Ok(fi_addr)
    }

    /// Remove an address inserted by [`Endpoint::insert`] (a peer gone).
    pub fn remove(&self, fi_addr: u64) {
        // SAFETY: the endpoint is valid; a stale address is refused by the
        // provider with an error, which is of no consequence here.
        unsafe { sys::spof_av_remove(self.raw.as_ptr(), fi_addr) };
    }

    /// Register `len` bytes at `base` for local and remote writes.
    ///
    /// # Safety
    /// `base..base + len` must stay allocated until the registration is
    /// dropped (the provider, or peers through it, write there).
    pub unsafe fn register(
        &self,
        base: NonNull<u8>,
        len: usize,
        requested_key: u64,
    ) -> Result<Registration, FabricError> {
        let (mut mr, mut key, mut desc) = (ptr::null_mut(), 0u64, ptr::null_mut());
        // SAFETY: `base..base + len` is allocated for the registration's
        // life (caller contract); the out-pointers are valid.
        let ret = unsafe {
            sys::spof_mr_reg(
                self.raw.as_ptr(),
                base.as_ptr() as *mut c_void,
                len,
                requested_key,
                &mut mr,
                &mut key,
                &mut desc,
            )
        };
        if ret != 0 || mr.is_null() {
            let hint = if ret == -12 || ret == -14 {
                " (is the locked-memory limit, `ulimit -l`, large enough for the rows?)"
            } else {
                ""
            };
            return Err(ofi_error(
                format!("fi_mr_reg of {len} bytes of rows"),
                None,
                format!("{}{hint}", strerror(ret as i64)),
            ));
        }
        Ok(Registration { mr, key, desc })
    }

    /// One RMA write of `len` bytes at `local` into `remote_addr` of the
    /// peer at `dest`; `context` comes back with its completion. `Ok(false)`:
    /// the transmit queue is full (drive completions and retry).
    ///
    /// # Safety
    /// `local..local + len` must stay allocated and inside `mr`'s
    /// registration until the write's completion is read.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub unsafe fn write(
        &self,
        local: *const u8,
        len: usize,
        mr: &Registration,
        dest: u64,
        remote_addr: u64,
        key: u64,
        context: usize,
    ) -> Result<bool, i64> {
        // SAFETY: the buffer is registered and lives until completion
        // (caller contract); the context is an integer the provider only
        // hands back.
        let ret = unsafe {
            sys::spof_write(
                self.raw.as_ptr(),
                local as *const c_void,
                len,
                mr.desc,
                dest,
                remote_addr,
                key,
                context as *mut c_void,
            )
        };
        eagain_or(ret)
    }

    /// Send the `len` bytes at `local` to the peer at `dest` (an endpoint
    /// opened with [`Endpoint::open_messaging`]); `context` comes back with
    /// its completion. `Ok(false)`: the transmit queue is full.
    ///
    /// # Safety
    /// `local..local + len` must stay allocated and inside `mr`'s
    /// registration until the send's completion is read.
    #[inline]
    pub unsafe fn send(
        &self,
        local: *const u8,
        len: usize,
        mr: &Registration,
        dest: u64,
        context: usize,
    ) -> Result<bool, i64> {
        // SAFETY: the buffer is registered and lives until completion
        // (caller contract); the context is an integer handed back.
        let ret = unsafe {
            sys::spof_send(
                self.raw.as_ptr(),
                local as *const c_void,
                len,
                mr.desc,
                dest,
                context as *mut c_void,
            )
        };
        eagain_or(ret)
    }

    /// Post a buffer of `len` bytes at `local` for one message from any
    /// peer (an endpoint opened with [`Endpoint::open_messaging`]);
    /// `context` comes back with the completion of the message received
    /// into it. `Ok(false)`: the receive queue is full.
    ///
    /// # Safety
    /// `local..local + len` must stay allocated, inside `mr`'s
    /// registration and otherwise untouched until its completion is read.
    #[inline]
    pub unsafe fn recv(&self, local: *mut u8, len: usize, mr: &Registration, context: usize) -> Result<bool, i64> {
        // SAFETY: as for `send` (caller contract).
        let ret = unsafe {
            sys::spof_recv(
                self.raw.as_ptr(),
                local as *mut c_void,
                len,
                mr.desc,
                context as *mut c_void,
            )
        };
        eagain_or(ret)
    }

    /// Read completions without blocking (driving the provider's progress),
    /// calling `each(context)` for each; returns how many, or the error
    /// completion at the head of the queue.
    pub fn poll(&self, each: impl FnMut(usize)) -> Result<usize, CompletionError> {
        let mut contexts = [ptr::null_mut::<c_void>(); COMPLETIONS_PER_READ];
        // SAFETY: `contexts` is valid for COMPLETIONS_PER_READ entries.
        let n = unsafe { sys::spof_cq_read(self.raw.as_ptr(), contexts.as_mut_ptr(), contexts.len()) };
        self.completed(n, &contexts, each)
    }

    /// As [`Endpoint::poll`], blocking up to `timeout_ms` for a completion
    /// (and driving progress meanwhile) when the queue has a wait object.
    pub fn wait(&self, timeout_ms: i32, each: impl FnMut(usize)) -> Result<usize, CompletionError> {
        if !self.granted.waitable {
            return self.poll(each);
        }
        let mut contexts = [ptr::null_mut::<c_void>(); COMPLETIONS_PER_READ];
        // SAFETY: `contexts` is valid for COMPLETIONS_PER_READ entries.
        let n = unsafe { sys::spof_cq_sread(self.raw.as_ptr(), contexts.as_mut_ptr(), contexts.len(), timeout_ms) };
        self.completed(n, &contexts, each)
    }

    fn completed(
        &self,
        n: isize,
        contexts: &[*mut c_void],
        mut each: impl FnMut(usize),
    ) -> Result<usize, CompletionError> {
        if n > 0 {
            let n = (n as usize).min(contexts.len());
            for c in &contexts[..n] {
                each(*c as usize);
            }
            return Ok(n);
        }
        if n == 0 || n == -(sys::FI_EAGAIN as isize) || n == -110 {
            // Nothing yet (-ETIMEDOUT from a timed wait).
            return Ok(0);
        }
        if n != -(sys::FI_EAVAIL as isize) {
            return Err(CompletionError {
                context: 0,
                fault: format!("fi_cq_read: {}", strerror(n as i64)),
            });
        }
        let mut context = ptr::null_mut();
        let mut code: c_int = 0;
        let mut buf = [0 as c_char; 256];
        // SAFETY: the out-pointers and the buffer are valid for the sizes
        // given.
        let ret =
            unsafe { sys::spof_cq_readerr(self.raw.as_ptr(), &mut context, &mut code, buf.as_mut_ptr(), buf.len()) };
        if ret < 0 {
            return Err(CompletionError {
                context: 0,
                fault: format!("fi_cq_readerr: {}", strerror(ret as i64)),
            });
        }
        Err(CompletionError {
            context: context as usize,
            fault: text(&buf),
        })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: opened in `open`, freed once here; every registration
        // and write borrowed `self`, so none outlives it.
        unsafe { sys::spof_close(self.raw.as_ptr()) };
    }
}

/// A posting call's result: issued, the queue full (`-FI_EAGAIN`), or
/// libfabric's error code.
#[inline]
fn eagain_or(ret: isize) -> Result<bool, i64> {
    match ret {
        0 => Ok(true),
        r if r == -(sys::FI_EAGAIN as isize) => Ok(false),
        r => Err(r as i64),
    }
}

/// An error completion: the failed write's context and the provider's text.
#[derive(Debug)]
pub struct CompletionError {
    pub context: usize,
    pub fault: String,
}

/// One memory registration; closed on drop (before its endpoint: the
/// owner declares it first).
pub struct Registration {
    mr: *mut sys::fid_mr,
    pub key: u64,
    desc: *mut c_void,
}

// SAFETY: the registration is an immutable handle after creation; the
// domain is FI_THREAD_SAFE, so it may be used from any thread.
unsafe impl Send for Registration {}
// SAFETY: as for Send.
unsafe impl Sync for Registration {}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: registered in `Endpoint::register`, closed once here.
        unsafe { sys::spof_mr_close(self.mr) };
    }
}
