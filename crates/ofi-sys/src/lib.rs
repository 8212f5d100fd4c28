//! # spindle-ofi-sys — the libfabric calls Spindle's `ofi` fabric uses
//!
//! Raw declarations of a small C shim (`shim/spindle_ofi.c`) compiled with
//! the `cc` crate and linked against the system libfabric. Safe wrappers
//! live in `spindle-fabric` (module `ofi`); this crate is FFI only.
//!
//! ## Why a shim and not bindgen or a crate from crates.io
//!
//! - Every data-path call Spindle needs (`fi_write`, `fi_cq_read`,
//!   `fi_cq_sread`, `fi_mr_reg`, `fi_endpoint`, `fi_close`, `fi_av_insert`,
//!   ...) is a `static inline` function in the libfabric headers that
//!   calls through an operation table; none is a symbol of
//!   `libfabric.so`. `bindgen` gives the tables but not the functions, so
//!   the Rust side would have to re-implement each inline call against a
//!   struct layout that changes between releases. A C file that calls
//!   the inline functions is compiled against the headers actually
//!   installed, so it stays right for whatever libfabric the machine has.
//! - `struct fi_info` and its attributes (dozens of fields, grown in most
//!   releases) stay on the C side: the Rust side sees an opaque
//!   `spof_endpoint` and plain integers, a surface of a few functions whose
//!   signatures are checked by hand against the shim below.
//! - crates.io (looked at when this crate was written): `libfabric` 0.0.1
//!   and `libfabric-sys` 0.0.2 are unmaintained placeholders;
//!   `ofi-libfabric-sys` 0.2.0 (from the OFI working group) runs `bindgen`
//!   at build time (needs libclang, which the build machines lack) against
//!   the libfabric 2.x tree it is published from, while Debian 12 ships
//!   libfabric 1.17. Revisit when a distribution ships 2.x headers.
//! - `bindgen` itself would add libclang to every `ofi` build for the
//!   same reason, and still need the shim for the inline calls.
//!
//! ## Features
//!
//! `libfabric` (off by default) compiles the shim and links `-lfabric`;
//! without it this crate is empty, so `cargo build --workspace` needs no
//! system library. `spindle-fabric`'s `ofi` feature turns it on. Set
//! `LIBFABRIC_DIR=<prefix>` to build against a libfabric outside the
//! system paths (its `include/` and `lib/`).
//!
//! ## Conventions
//!
//! As in libfabric: `0` or a count on success, a negative `-FI_E...` code
//! on failure; `spof_strerror` names it. Error strings are written into
//! caller buffers, NUL-terminated.
#![cfg_attr(not(feature = "libfabric"), allow(unused))]

#[cfg(feature = "libfabric")]
pub use ffi::*;

/// `spof_flags`: RMA writes to one peer land in issue order
/// (`FI_ORDER_WAW` granted).
pub const SPOF_ORDERED_WAW: u32 = 1;
/// `spof_flags`: the completion queue has a wait object, so
/// `spof_cq_sread` blocks (and drives progress) instead of spinning.
pub const SPOF_WAITABLE: u32 = 2;
/// `FI_EAGAIN` (`rdma/fi_errno.h`): try again (queue full, nothing to read).
pub const FI_EAGAIN: i32 = 11;
/// `FI_EAVAIL`: an error completion is at the head of the queue.
pub const FI_EAVAIL: i32 = 259;
/// `FI_ENODATA`: no provider matched.
pub const FI_ENODATA: i32 = 61;
/// `spof_flags`: remote addresses are virtual addresses in the target's
/// memory (`FI_MR_VIRT_ADDR`), not offsets into its registration.
pub const SPOF_MR_VIRT_ADDR: u32 = 4;
/// `spof_flags`: a write's local buffer needs its registration's
/// descriptor (`FI_MR_LOCAL`).
pub const SPOF_MR_LOCAL: u32 = 8;
/// `spof_flags`: the provider picks registration keys (`FI_MR_PROV_KEY`).
pub const SPOF_MR_PROV_KEY: u32 = 16;
/// `spof_flags`: a write completes only once its bytes are in the
/// target's memory (`FI_DELIVERY_COMPLETE`), not when they were sent.
pub const SPOF_DELIVERY_COMPLETE: u32 = 32;
/// `spof_flags`: the endpoint also sends and receives messages (`FI_MSG`).
pub const SPOF_MSG: u32 = 64;
/// `spof_open` flag: every write completes once delivered
/// (`FI_DELIVERY_COMPLETE`).
pub const SPOF_OPEN_DELIVERY_COMPLETE: i32 = 1;
/// `spof_open` flag: messages too (`FI_MSG`: `spof_send`, `spof_recv`).
pub const SPOF_OPEN_MSG: i32 = 2;

#[cfg(feature = "libfabric")]
mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    /// An opened endpoint with its fabric, domain, completion queue and
    /// address vector (opaque; `spof_close` frees it all).
    #[repr(C)]
    pub struct spof_endpoint {
        _private: [u8; 0],
    }

    /// A memory registration (`struct fid_mr`, opaque).
    #[repr(C)]
    pub struct fid_mr {
        _private: [u8; 0],
    }

    extern "C" {
        /// libfabric's text for an error code (either sign).
        pub fn spof_strerror(code: c_int) -> *const c_char;
        /// Providers offering RDM endpoints with RMA writes, comma-separated.
        pub fn spof_providers(buf: *mut c_char, buf_len: usize) -> c_int;
        pub fn spof_open(
            provider: *const c_char,
            trust_order: c_int,
            open_flags: c_int,
            cq_depth: usize,
            out: *mut *mut spof_endpoint,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
        pub fn spof_close(e: *mut spof_endpoint);
        pub fn spof_flags(e: *const spof_endpoint) -> u32;
        pub fn spof_max_msg_size(e: *const spof_endpoint) -> u64;
        pub fn spof_describe(e: *const spof_endpoint, buf: *mut c_char, buf_len: usize);
        pub fn spof_getname(e: *mut spof_endpoint, addr: *mut c_void, len: *mut usize) -> c_int;
        pub fn spof_av_insert(e: *mut spof_endpoint, addr: *const c_void, fi_addr: *mut u64) -> c_int;
        pub fn spof_av_remove(e: *mut spof_endpoint, fi_addr: u64) -> c_int;
        pub fn spof_mr_reg(
            e: *mut spof_endpoint,
            buf: *mut c_void,
            len: usize,
            requested_key: u64,
            mr: *mut *mut fid_mr,
            key: *mut u64,
            desc: *mut *mut c_void,
        ) -> c_int;
        pub fn spof_mr_close(mr: *mut fid_mr);
        pub fn spof_write(
            e: *mut spof_endpoint,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            dest: u64,
            addr: u64,
            key: u64,
            context: *mut c_void,
        ) -> isize;
        pub fn spof_send(
            e: *mut spof_endpoint,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            dest: u64,
            context: *mut c_void,
        ) -> isize;
        pub fn spof_recv(
            e: *mut spof_endpoint,
            buf: *mut c_void,
            len: usize,
            desc: *mut c_void,
            context: *mut c_void,
        ) -> isize;
        pub fn spof_cq_read(e: *mut spof_endpoint, contexts: *mut *mut c_void, count: usize) -> isize;
        pub fn spof_cq_sread(
            e: *mut spof_endpoint,
            contexts: *mut *mut c_void,
            count: usize,
            timeout_ms: c_int,
        ) -> isize;
        pub fn spof_cq_readerr(
            e: *mut spof_endpoint,
            context: *mut *mut c_void,
            code: *mut c_int,
            buf: *mut c_char,
            buf_len: usize,
        ) -> c_int;
    }
}
