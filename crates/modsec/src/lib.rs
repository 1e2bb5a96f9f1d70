//! Safe Rust wrapper over Debian's libmodsecurity 3 (own FFI, linked via pkg-config).
//!
//! The crates.io `modsecurity` crate needs libmodsecurity >= 3.0.13; Debian 12 ships
//! 3.0.9, so this crate declares the small part of the C API it needs (`ffi`) and wraps
//! it:
//!
//! - [`ModSecurity`]: the process-wide engine (`msc_init`), with our server log callback.
//! - [`RuleSet`]: rules compiled once and shared read-only across threads (`Arc`).
//! - [`Transaction`]: one HTTP exchange. It holds both `Arc`s, so it can outlive the
//!   request (for a later response check) and be moved between threads. Its
//!   [`MatchReport`] collects the rule ids, messages and anomaly scores from the log
//!   callback and from interventions, because the C API cannot read TX variables.
//! - [`crs`]: the engine settings Debian does not ship plus Debian's OWASP CRS.
//! - [`exit_now`]: leaving while an evaluation still runs, without tearing down
//!   libmodsecurity's static objects under it.
//!
//! Every call is synchronous and CPU-bound (1.5-1.8 ms of CPU per request with CRS at
//! paranoia level 1 on the development machine; `examples/bench.rs`): callers in async
//! code run it on a bounded blocking pool.
//!
//! # Threads (what libmodsecurity 3.0.9 allows, read from its source)
//!
//! - **Compiling rules is not thread-safe**: the flex/bison parser has global state, and
//!   two concurrent compilations abort the process ("fatal flex scanner internal error").
//!   This crate holds one process-wide lock around every compilation (and `msc_init`).
//!   Evaluation does not take it, so a reload compiles while requests keep flowing.
//! - **A compiled rule set is read-only during evaluation** (operators keep precompiled
//!   PCRE2 patterns and Aho-Corasick trees; per-request state lives in the transaction),
//!   so [`RuleSet`] is `Send + Sync` and shared through `Arc`.
//! - **A transaction is used by one thread at a time** (`&mut self`), may move between
//!   threads ([`Transaction`] is `Send`, not `Sync`), and its log callback runs
//!   synchronously on the calling thread.
//! - **Persistent collections** (`GLOBAL`, `IP`, `SESSION`, `USER`, `RESOURCE`) are
//!   in-memory in Debian's build (no LMDB) and belong to the engine, so they live as long
//!   as the process. Up to 3.0.12 writes are locked and reads are not (3.0.13 added a
//!   shared lock for reads). CRS 3.3 *writes* `IP` by default: the scanner rules
//!   (913100, 913110, 913120; 913101 and 913102 at paranoia level 2) set
//!   `ip.reput_block_flag` and `ip.reput_block_reason` for the client's address and
//!   User-Agent. It *reads* `IP` only with IP reputation blocking (`tx.do_reput_block`,
//!   910000) or the DoS protection (912xxx), both off by default. So the defaults are
//!   safe with concurrent transactions (writes are serialised), while turning either on,
//!   or custom rules reading `ip.…`, races with those writes inside libmodsecurity up to
//!   3.0.12: do not, with a multi-threaded caller.
//! - **Memory** (measured in `tests/modsec/accounting.rs`, on 3.0.9 and 3.0.14): a
//!   transaction leaves nothing behind once dropped (benign requests, denied attacks,
//!   100 KB bodies, response phases: 0 bytes per transaction), and neither does this
//!   wrapper (every intervention string, rule error and report is freed). What stays is
//!   libmodsecurity's: each (address, User-Agent) a scanner rule flagged keeps ~450-500
//!   bytes in the `IP` collection for good (`expirevar` does nothing before 3.0.11; from 3.0.11 an
//!   expired entry is deleted only when the same key is read again, which the defaults
//!   never do), and each compilation of a rule set keeps ~2.5-3 KB in the SecLang
//!   parser. While it runs, a transaction holds about 7 times its request body (the
//!   body, `ARGS`, `REQUEST_BODY` and the transformed copies CRS asks for).
//!
//! ```no_run
//! use lastcall_modsec::{crs, ModSecurity, RuleSet, Transaction};
//! let ms = ModSecurity::new()?;
//! let rules = RuleSet::from_directives(
//!     &crs::debian_default_directives(&crs::CrsOptions::default()),
//!     "default",
//! )?;
//! let mut tx = Transaction::new(&ms, &rules, None)?;
//! tx.process_connection("127.0.0.1", 40000, "127.0.0.1", 80)?;
//! tx.process_uri("/?id=1' OR '1'='1", "GET", "1.1")?;
//! tx.add_request_header(b"Host", b"example.com")?;
//! tx.process_request_headers()?;
//! let verdict = tx.process_request_body()?; // phase 2 decides most CRS blocks, even for GET
//! assert_eq!(verdict.map(|i| i.status), Some(403));
//! # Ok::<(), lastcall_modsec::Error>(())
//! ```

#![allow(
    unsafe_code,
    reason = "the FFI crate: every unsafe block calls libmodsecurity's C API"
)]

pub mod crs;
mod ffi;
mod report;

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

/// libmodsecurity's rule parser (flex/bison) keeps global state: two threads compiling
/// rules at the same time crash the process ("fatal flex scanner internal error"). Every
/// compilation, and engine creation, holds this lock. Evaluation does not need it.
static PARSER_LOCK: Mutex<()> = Mutex::new(());

fn parser_lock() -> MutexGuard<'static, ()> {
    PARSER_LOCK.lock()
}

pub use report::{MatchReport, RuleMatch};

/// Ends the process now with status `code`, without `atexit` handlers or C++ static
/// destructors: for a process that must leave while an evaluation may still run on another
/// thread, because destroying libmodsecurity's static objects under a running transaction
/// races with it. Standard output and error are flushed first.
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` takes no pointer and ends the process at once; no Rust invariant can
    // be observed broken afterwards.
    unsafe { libc::_exit(code) }
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `msc_init` returned NULL.
    #[error("libmodsecurity: msc_init failed")]
    Init,
    /// The rules did not compile; `message` is libmodsecurity's parser error (it names the
    /// file and line).
    #[error("rules from {origin}: {message}")]
    Rules {
        /// Where the rules came from (the `origin` given, or the file path).
        origin: String,
        /// libmodsecurity's message.
        message: String,
    },
    /// A string passed to libmodsecurity contained a NUL byte.
    #[error("{what} contains a NUL byte")]
    Nul {
        /// Which argument.
        what: &'static str,
    },
    /// `msc_new_transaction` returned NULL.
    #[error("libmodsecurity: could not create a transaction")]
    Transaction,
    /// A libmodsecurity call reported failure.
    #[error("libmodsecurity: {call} failed")]
    Call {
        /// The C function.
        call: &'static str,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A disruptive decision of the rules (`msc_intervention`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intervention {
    /// HTTP status to answer with (e.g. 403).
    pub status: u16,
    /// Redirect target (`redirect:` action).
    pub url: Option<String>,
    /// libmodsecurity's log line for the decision ("ModSecurity: Access denied …").
    pub log: Option<String>,
    /// Always true for interventions returned by this crate (kept for completeness).
    pub disruptive: bool,
    /// The rule id of `log`, read knowing the transaction (see [`RuleMatch::ambiguous`]).
    rule: Option<u32>,
}

impl Intervention {
    /// The rule id in the intervention's log line (`[id "…"]`), if any: the reading
    /// libmodsecurity wrote, whatever the request imitated (see [`RuleMatch::ambiguous`]).
    pub fn rule_id(&self) -> Option<u32> {
        self.rule
    }
}

/// The libmodsecurity engine: one per process is enough.
pub struct ModSecurity {
    ptr: NonNull<ffi::ModSecurityT>,
}

// SAFETY: after `new` returns, the only uses of the `ModSecurity` object are read-only:
// `msc_who_am_i` (returns a string member), `msc_new_transaction` (stores the pointer)
// and `serverLog` from transactions (reads the callback pointer and flags). The
// persistent collections it owns (global/ip/session/user/resource, in-memory in Debian's
// build) lock on writes; see "Threads" in the crate docs for the limit of that (reads are
// unlocked in 3.0.9, which matters only to rule sets that *write* those collections).
unsafe impl Send for ModSecurity {}
// SAFETY: see `Send`: shared use is read-only apart from the collections' own locking.
unsafe impl Sync for ModSecurity {}

/// The process-wide engine (see [`ModSecurity::new`]).
static ENGINE: Mutex<Option<Arc<ModSecurity>>> = Mutex::new(None);

impl ModSecurity {
    /// The process-wide engine: created on first use (`msc_init`, connector information
    /// `lastcall-modsec/<version>`, the server log callback routing text lines to each
    /// transaction's [`MatchReport`]) and then shared; every call returns the same one.
    ///
    /// One engine per process, kept until exit, because libmodsecurity 3.0.9's engine
    /// constructor and destructor set up and tear down process-global libraries
    /// (`curl_global_init`/`curl_global_cleanup`, `xmlInitParser`/`xmlCleanupParser`):
    /// destroying one engine while another engine's transactions parse XML in another
    /// thread is a use-after-free inside libxml2.
    pub fn new() -> Result<Arc<Self>> {
        let mut slot = ENGINE.lock();
        if let Some(engine) = slot.as_ref() {
            return Ok(Arc::clone(engine));
        }
        let engine = Arc::new(Self::init()?);
        *slot = Some(Arc::clone(&engine));
        Ok(engine)
    }

    fn init() -> Result<Self> {
        let guard = parser_lock();
        // SAFETY: msc_init has no preconditions; it returns an owned object or NULL.
        let raw = unsafe { ffi::msc_init() };
        drop(guard);
        let ptr = NonNull::new(raw).ok_or(Error::Init)?;
        let ms = ModSecurity { ptr };
        let connector = CString::new(concat!("lastcall-modsec/", env!("CARGO_PKG_VERSION")))
            .map_err(|_| Error::Nul { what: "connector" })?;
        // SAFETY: `ptr` is a live engine owned by `ms`; the string is copied by the
        // library (std::string assignment) before the call returns.
        unsafe { ffi::msc_set_connector_info(ms.ptr.as_ptr(), connector.as_ptr()) };
        // SAFETY: `ptr` is live; `log_callback` is a plain function valid for the whole
        // program and never unwinds.
        unsafe { ffi::msc_set_log_cb(ms.ptr.as_ptr(), Some(log_callback)) };
        Ok(ms)
    }

    /// `msc_who_am_i`: libmodsecurity's version string, e.g. "ModSecurity v3.0.9 (Linux)".
    pub fn who_am_i(&self) -> String {
        // SAFETY: `ptr` is live; the returned pointer is to a std::string member of the
        // engine that lives as long as `self`; we copy it out at once.
        let p = unsafe { ffi::msc_who_am_i(self.ptr.as_ptr()) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated (std::string::c_str), alive for this call.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// The loaded library's release, e.g. "3.0.14": [`who_am_i`](Self::who_am_i)'s version
    /// (compiled into the shared object, so it names the library this process loaded, not
    /// the headers it was built against); empty if the string has none.
    pub fn version(&self) -> String {
        release_of(&self.who_am_i()).to_owned()
    }
}

/// The `X.Y.Z` after the `v` in "ModSecurity v3.0.9 (Linux)".
fn release_of(who_am_i: &str) -> &str {
    who_am_i
        .split_whitespace()
        .filter_map(|word| word.strip_prefix('v'))
        .find(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        .unwrap_or("")
}

impl Drop for ModSecurity {
    fn drop(&mut self) {
        // Runs only for an engine that failed half-way through `init` (the process-wide
        // one lives in `ENGINE` until exit).
        // SAFETY: we own the engine and no transaction refers to it (each holds an Arc).
        unsafe { ffi::msc_cleanup(self.ptr.as_ptr()) };
    }
}

impl std::fmt::Debug for ModSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModSecurity").finish_non_exhaustive()
    }
}

/// A compiled rule set, shared read-only by any number of transactions on any threads.
pub struct RuleSet {
    ptr: NonNull<ffi::RulesSetT>,
    origin: String,
    rule_count: usize,
}

// SAFETY: a RulesSet is mutated only while it is loaded (`from_*` below, before it is
// shared). Transactions keep a pointer to it and only read it: rules, operators
// (precompiled PCRE2 patterns with per-call match data, Aho-Corasick trees walked
// without writing), actions and the engine properties. Per-request state (TX, matched
// vars, `ctl:` rule removals) lives in the Transaction. libmodsecurity's multi-threaded
// connectors rely on the same sharing.
unsafe impl Send for RuleSet {}
// SAFETY: see `Send`.
unsafe impl Sync for RuleSet {}

impl RuleSet {
    /// Compiles rules given as text (ModSecurity directives). `origin` names them in
    /// errors; libmodsecurity's message carries the file and line for included files,
    /// and the line within `text` otherwise.
    pub fn from_directives(text: &str, origin: &str) -> Result<Arc<Self>> {
        let c = CString::new(text).map_err(|_| Error::Nul { what: "rules" })?;
        Self::load(origin, |rules, err| {
            // SAFETY: `rules` is a live, unshared RulesSet; `c` is NUL-terminated and
            // outlives the call; `err` points to a writable `*const c_char`.
            unsafe { ffi::msc_rules_add(rules, c.as_ptr(), err) }
        })
    }

    /// Compiles the rules in a file (and what it includes).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Arc<Self>> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::Nul { what: "path" })?;
        Self::load(&origin, |rules, err| {
            // SAFETY: as in `from_directives`.
            unsafe { ffi::msc_rules_add_file(rules, c.as_ptr(), err) }
        })
    }

    /// Where the rules came from (the `origin` or path given).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// How many rules libmodsecurity reported loading.
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }

    /// Compiles under [`PARSER_LOCK`], on the rules thread ([`on_rules_thread`]); frees
    /// the rules and the error string on every path.
    fn load(
        origin: &str,
        add: impl FnOnce(*mut ffi::RulesSetT, *mut *const c_char) -> c_int + Send,
    ) -> Result<Arc<Self>> {
        // SAFETY: no preconditions; returns an owned RulesSet or NULL.
        let raw = unsafe { ffi::msc_create_rules_set() };
        let ptr = NonNull::new(raw).ok_or(Error::Rules {
            origin: origin.to_owned(),
            message: "msc_create_rules_set failed".to_owned(),
        })?;
        // From here on Drop frees the rules, also on error.
        let mut set = RuleSet {
            ptr,
            origin: origin.to_owned(),
            rule_count: 0,
        };
        let rules = Handoff(set.ptr.as_ptr());
        let (n, err) = on_rules_thread(move || {
            let mut err: *const c_char = std::ptr::null();
            let n = {
                let _guard = parser_lock();
                add(rules.get(), &mut err)
            };
            (n, Handoff(err.cast_mut()))
        });
        let message = take_malloced_string(err.get());
        if n < 0 {
            return Err(Error::Rules {
                origin: origin.to_owned(),
                message: message
                    .map(|m| m.trim_end().to_owned())
                    .unwrap_or_else(|| "unknown error".to_owned()),
            });
        }
        set.rule_count = usize::try_from(n).unwrap_or(0);
        Ok(Arc::new(set))
    }
}

impl Drop for RuleSet {
    fn drop(&mut self) {
        let rules = Handoff(self.ptr.as_ptr());
        on_rules_thread(move || {
            // SAFETY: we own the rules; every Transaction holds an Arc<RuleSet>, so none is
            // alive when the last Arc drops, and this thread is the only one using them.
            unsafe { ffi::msc_rules_cleanup(rules.get()) };
            give_back_freed_memory();
        });
    }
}

/// A pointer handed to the thread that compiles or frees a rule set, while the thread that
/// owns it waits for that one to finish.
struct Handoff<T>(*mut T);

// SAFETY: the pointer is used by one thread at a time: the owner hands it over and blocks
// until the rules thread is done with it (`on_rules_thread` waits for its result).
unsafe impl<T> Send for Handoff<T> {}

impl<T> Handoff<T> {
    /// The pointer (a method, so that closures capture the whole `Handoff`, not its field).
    fn get(self) -> *mut T {
        self.0
    }
}

/// Runs `f` on the rules thread and waits for it (here, if no thread can be started, or
/// when called from the rules thread itself).
///
/// A rule set is ~15 MB of small allocations (CRS). Compiled on whichever thread happened
/// to reload (a tokio blocking thread) and freed on whichever dropped the last reference
/// (an evaluation thread), each reload left about a rule set's worth of freed memory in
/// that thread's arena or heap: the agent's RSS stepped up by 15-23 MB at reloads and
/// stayed there (docs/benchmarks.md, *Soak*). Compiled and freed on a new thread each time,
/// with glibc's free pages handed back after each cleanup and another allocator's through
/// [`after_rules_freed`], a reload's memory went back, but for the pages that the few
/// objects libmodsecurity keeps from each compilation (~3 KB) pinned: each new thread's
/// heap took fresh pages, so each reload pinned a few of its own (mimalloc: 34.9 → 49.0 MiB
/// over 60 reloads, ~0.24 MiB per reload at first). One long-lived thread compiles and
/// frees every rule set, so each compilation reuses the pages the last one freed: after
/// 200 reloads mimalloc's RSS is 49.2 instead of 52.4 MiB. Both allocators still climb by
/// about one rule set's worth over ~150 reloads (the arena's layout), then stop.
fn on_rules_thread<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if ON_RULES_THREAD.with(std::cell::Cell::get) {
        return f();
    }
    let Some(jobs) = rules_thread() else {
        return f();
    };
    let (done, result) = std::sync::mpsc::sync_channel(1);
    let job = move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = done.send(r);
    };
    let job: Box<dyn FnOnce() + Send + '_> = Box::new(job);
    // SAFETY: only the lifetime is changed. The job borrows from this frame (`f`'s
    // captures) and this function returns only after the job has run to the point of
    // sending its result (it consumed `f` before that), or after the job came back unsent
    // and ran here; the rules thread catches every panic, so it never drops a job unrun.
    let job: Job = unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + '_>, Job>(job) };
    if let Err(std::sync::mpsc::SendError(job)) = jobs.send(job) {
        job();
    }
    match result.recv() {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => unreachable!("the rules thread dropped a job without running it"),
    }
}

/// A job for the rules thread.
type Job = Box<dyn FnOnce() + Send + 'static>;

thread_local! {
    /// Set on the rules thread, which runs its own nested jobs in place.
    static ON_RULES_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The rules thread's queue, starting the thread on first use (`None`: it cannot start).
fn rules_thread() -> Option<std::sync::mpsc::Sender<Job>> {
    static JOBS: Mutex<Option<std::sync::mpsc::Sender<Job>>> = Mutex::new(None);
    let mut jobs = JOBS.lock();
    if let Some(tx) = jobs.as_ref() {
        return Some(tx.clone());
    }
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("lastcall-rules".into())
        .spawn(move || {
            ON_RULES_THREAD.with(|on| on.set(true));
            // Each job catches its own panic (`on_rules_thread`), so this runs until exit.
            for job in rx {
                job();
            }
        })
        .ok()?;
    *jobs = Some(tx.clone());
    Some(tx)
}

/// The function [`after_rules_freed`] registered, if any.
static AFTER_RULES_FREED: Mutex<Option<fn()>> = Mutex::new(None);

/// Registers `hook` to run each time a rule set has been freed, on the thread that freed
/// it, right after glibc's free pages were handed back (`malloc_trim`): the place for a
/// process whose allocator replaces malloc, which this crate does not know, to give back
/// what the rule set held (~15 MB with CRS). lastcall-spoa, built with mimalloc, registers
/// `mi_collect(true)`. A later call replaces the hook; it should not panic (a panic
/// propagates to whoever dropped the last reference to the rule set).
pub fn after_rules_freed(hook: fn()) {
    *AFTER_RULES_FREED.lock() = Some(hook);
}

/// Returns glibc's free pages to the system (`malloc_trim`): after a rule set was freed,
/// most of its ~15 MB sits in free chunks inside the arenas (a no-op where another
/// allocator replaces malloc: glibc's own arenas are then empty); then runs the hook
/// registered with [`after_rules_freed`], which does the same for that allocator.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes a plain size and only works on the allocator's own state,
    // under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
    // Copied out, so that the hook runs without the lock (it may register another).
    let hook = *AFTER_RULES_FREED.lock();
    if let Some(hook) = hook {
        hook();
    }
}

impl std::fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleSet")
            .field("origin", &self.origin)
            .field("rule_count", &self.rule_count)
            .finish_non_exhaustive()
    }
}

/// One HTTP exchange through the rules. Call the phases in order; each `process_*`
/// returns the intervention (deny, redirect, …) it caused, if any.
pub struct Transaction {
    ptr: NonNull<ffi::TransactionT>,
    /// Owned `Box<MatchReport>` (from `Box::into_raw`), also the log callback's data
    /// pointer. Written only by the callback, which libmodsecurity calls synchronously
    /// from within the `&mut self` methods below; read through `report(&self)`.
    report: NonNull<MatchReport>,
    id: Option<String>,
    _engine: Arc<ModSecurity>,
    _rules: Arc<RuleSet>,
}

// SAFETY: a libmodsecurity Transaction has no thread affinity (no thread-locals); it may
// be used from any thread as long as calls do not overlap, which `&mut self` guarantees.
// The report box is only touched from those calls. Not Sync (raw pointers).
unsafe impl Send for Transaction {}

impl Transaction {
    /// `msc_new_transaction[_with_id]`. `id` becomes libmodsecurity's unique id (in logs);
    /// without it libmodsecurity generates one.
    pub fn new(engine: &Arc<ModSecurity>, rules: &Arc<RuleSet>, id: Option<&str>) -> Result<Self> {
        let report = NonNull::from(Box::leak(Box::<MatchReport>::default()));
        let data = report.as_ptr().cast::<c_void>();
        let raw = match id {
            Some(id) => {
                let c = match CString::new(id) {
                    Ok(c) => c,
                    Err(_) => {
                        free_report(report);
                        return Err(Error::Nul {
                            what: "transaction id",
                        });
                    }
                };
                // SAFETY: engine and rules are live (we hold Arcs); the id is copied into a
                // std::string by the constructor (it is never written through, despite
                // the `char *`); `data` stays valid until Drop frees it after cleanup.
                unsafe {
                    ffi::msc_new_transaction_with_id(
                        engine.ptr.as_ptr(),
                        rules.ptr.as_ptr(),
                        c.as_ptr().cast_mut(),
                        data,
                    )
                }
            }
            // SAFETY: as above.
            None => unsafe {
                ffi::msc_new_transaction(engine.ptr.as_ptr(), rules.ptr.as_ptr(), data)
            },
        };
        let Some(ptr) = NonNull::new(raw) else {
            free_report(report);
            return Err(Error::Transaction);
        };
        let mut tx = Transaction {
            ptr,
            report,
            id: id.map(str::to_owned),
            _engine: Arc::clone(engine),
            _rules: Arc::clone(rules),
        };
        if let Some(id) = id {
            tx.report_mut().know_id(id);
        }
        Ok(tx)
    }

    /// The id given to [`Transaction::new`], if any.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The rule set this transaction runs.
    pub fn rules(&self) -> &Arc<RuleSet> {
        &self._rules
    }

    /// Phase 0: the connection's addresses.
    pub fn process_connection(
        &mut self,
        client_ip: &str,
        client_port: u16,
        server_ip: &str,
        server_port: u16,
    ) -> Result<Option<Intervention>> {
        let c = cstring(client_ip, "client address")?;
        let s = cstring(server_ip, "server address")?;
        self.report_mut().know_server(server_ip);
        // SAFETY: live transaction, exclusive (&mut); strings are copied by the callee.
        let rc = unsafe {
            ffi::msc_process_connection(
                self.ptr.as_ptr(),
                c.as_ptr(),
                c_int::from(client_port),
                s.as_ptr(),
                c_int::from(server_port),
            )
        };
        self.finish("msc_process_connection", rc)
    }

    /// The request line: `uri` is the path with query string as sent, `method` e.g. "GET",
    /// `http_version` e.g. "1.1".
    pub fn process_uri(
        &mut self,
        uri: &str,
        method: &str,
        http_version: &str,
    ) -> Result<Option<Intervention>> {
        let u = cstring(uri, "uri")?;
        let m = cstring(method, "method")?;
        let v = cstring(http_version, "http version")?;
        self.report_mut().know_uri(uri);
        // SAFETY: live transaction, exclusive; strings are copied by the callee.
        let rc =
            unsafe { ffi::msc_process_uri(self.ptr.as_ptr(), u.as_ptr(), m.as_ptr(), v.as_ptr()) };
        self.finish("msc_process_uri", rc)
    }

    /// Adds one request header (bytes, no NUL restriction).
    pub fn add_request_header(&mut self, name: &[u8], value: &[u8]) -> Result<()> {
        // SAFETY: live transaction, exclusive; pointer/length pairs are valid for the call
        // and copied by the callee.
        let rc = unsafe {
            ffi::msc_add_n_request_header(
                self.ptr.as_ptr(),
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
            )
        };
        check("msc_add_n_request_header", rc)
    }

    /// Phase 1.
    pub fn process_request_headers(&mut self) -> Result<Option<Intervention>> {
        // SAFETY: live transaction, exclusive.
        let rc = unsafe { ffi::msc_process_request_headers(self.ptr.as_ptr()) };
        self.finish("msc_process_request_headers", rc)
    }

    /// Appends a chunk of the request body. Past `SecRequestBodyLimit`, with
    /// `ProcessPartial` the rest is dropped and [`MatchReport::request_body_truncated`]
    /// is set; with `Reject` (engine `On`) the next `process_*` returns a 403.
    pub fn append_request_body(&mut self, body: &[u8]) -> Result<()> {
        // SAFETY: live transaction, exclusive; (ptr, len) valid for the call, copied.
        let rc =
            unsafe { ffi::msc_append_request_body(self.ptr.as_ptr(), body.as_ptr(), body.len()) };
        if rc == 0 {
            // 3.0.9 returns false only when the body limit was hit under ProcessPartial.
            self.report_mut().set_request_body_truncated();
        }
        Ok(())
    }

    /// Phase 2. Call it even for requests without a body: most CRS blocks are decided
    /// here (the blocking evaluation, 949110, runs in phase 2).
    pub fn process_request_body(&mut self) -> Result<Option<Intervention>> {
        // SAFETY: live transaction, exclusive.
        let rc = unsafe { ffi::msc_process_request_body(self.ptr.as_ptr()) };
        self.finish("msc_process_request_body", rc)
    }

    /// Adds one response header.
    pub fn add_response_header(&mut self, name: &[u8], value: &[u8]) -> Result<()> {
        // SAFETY: as in `add_request_header`.
        let rc = unsafe {
            ffi::msc_add_n_response_header(
                self.ptr.as_ptr(),
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
            )
        };
        check("msc_add_n_response_header", rc)
    }

    /// Phase 3: response status and protocol (e.g. "HTTP/1.1").
    pub fn process_response_headers(
        &mut self,
        status: u16,
        protocol: &str,
    ) -> Result<Option<Intervention>> {
        let p = cstring(protocol, "protocol")?;
        // SAFETY: live transaction, exclusive; the protocol string is copied.
        let rc = unsafe {
            ffi::msc_process_response_headers(self.ptr.as_ptr(), c_int::from(status), p.as_ptr())
        };
        self.finish("msc_process_response_headers", rc)
    }

    /// Appends a chunk of the response body (inspected only with
    /// `SecResponseBodyAccess On` and a matching `SecResponseBodyMimeType`).
    pub fn append_response_body(&mut self, body: &[u8]) -> Result<()> {
        // SAFETY: as in `append_request_body`.
        let rc =
            unsafe { ffi::msc_append_response_body(self.ptr.as_ptr(), body.as_ptr(), body.len()) };
        if rc == 0 {
            self.report_mut().set_response_body_truncated();
        }
        Ok(())
    }

    /// Phase 4.
    pub fn process_response_body(&mut self) -> Result<Option<Intervention>> {
        // SAFETY: live transaction, exclusive.
        let rc = unsafe { ffi::msc_process_response_body(self.ptr.as_ptr()) };
        self.finish("msc_process_response_body", rc)
    }

    /// Phase 5 (logging; CRS's correlation rules 980xxx report the final scores here).
    pub fn process_logging(&mut self) -> Result<()> {
        // SAFETY: live transaction, exclusive.
        let rc = unsafe { ffi::msc_process_logging(self.ptr.as_ptr()) };
        check("msc_process_logging", rc)
    }

    /// `msc_update_status_code`: tells the rules the final response status (e.g. when
    /// the response was replaced after phase 3).
    pub fn update_status_code(&mut self, status: u16) -> Result<()> {
        // SAFETY: live transaction, exclusive.
        let rc = unsafe { ffi::msc_update_status_code(self.ptr.as_ptr(), c_int::from(status)) };
        check("msc_update_status_code", rc)
    }

    /// How many request body bytes libmodsecurity holds (after any limit).
    pub fn request_body_length(&mut self) -> usize {
        // SAFETY: live transaction, exclusive.
        unsafe { ffi::msc_get_request_body_length(self.ptr.as_ptr()) }
    }

    /// Checks for an intervention now (e.g. after a body chunk went over a `Reject`
    /// limit). Each intervention is reported once.
    pub fn intervention(&mut self) -> Option<Intervention> {
        let mut it = ffi::ModSecurityIntervention {
            status: 200,
            pause: 0,
            url: std::ptr::null_mut(),
            log: std::ptr::null_mut(),
            disruptive: 0,
        };
        // SAFETY: live transaction, exclusive; `it` is initialised (the library only
        // writes url/log when it has them, with strdup), and we free what it wrote.
        let disruptive = unsafe { ffi::msc_intervention(self.ptr.as_ptr(), &mut it) };
        let url = take_malloced_string(it.url);
        let log = take_malloced_string(it.log);
        if disruptive == 0 && it.disruptive == 0 {
            return None;
        }
        let rule = log.as_deref().map(|line| {
            self.report_mut().record_line(line, true);
            self.report().parse(line, true).id
        });
        Some(Intervention {
            status: u16::try_from(it.status).unwrap_or(403),
            url,
            log,
            disruptive: true,
            rule: rule.filter(|&id| id != 0),
        })
    }

    /// What matched so far.
    pub fn report(&self) -> &MatchReport {
        // SAFETY: `report` is a live Box owned by self; it is mutated only by the log
        // callback and `report_mut`, both inside `&mut self` methods, so no mutation can
        // overlap this shared borrow.
        unsafe { self.report.as_ref() }
    }

    fn report_mut(&mut self) -> &mut MatchReport {
        // SAFETY: as in `report`; `&mut self` excludes any other borrow of the report, and
        // the callback does not run outside libmodsecurity calls.
        unsafe { self.report.as_mut() }
    }

    fn finish(&mut self, call: &'static str, rc: c_int) -> Result<Option<Intervention>> {
        let it = self.intervention();
        if it.is_none() {
            check(call, rc)?;
        }
        Ok(it)
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        // SAFETY: we own the transaction and nothing else refers to it; the engine and
        // rules it points to are still alive (our Arcs drop after this function).
        unsafe { ffi::msc_transaction_cleanup(self.ptr.as_ptr()) };
        free_report(self.report);
    }
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("id", &self.id)
            .field("report", self.report())
            .finish_non_exhaustive()
    }
}

fn free_report(report: NonNull<MatchReport>) {
    // SAFETY: `report` came from Box::leak in `Transaction::new` and is freed exactly once:
    // on the error paths of `new` (before any Transaction owns it) or in Drop, after
    // msc_transaction_cleanup (so the callback can no longer see it).
    drop(unsafe { Box::from_raw(report.as_ptr()) });
}

fn cstring(s: &str, what: &'static str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Nul { what })
}

fn check(call: &'static str, rc: c_int) -> Result<()> {
    if rc == 0 {
        Err(Error::Call { call })
    } else {
        Ok(())
    }
}

/// Copies and frees a string the library allocated with malloc/strdup.
fn take_malloced_string(p: *mut c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL, NUL-terminated (strdup).
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    // SAFETY: allocated by the library with malloc (strdup) and owned by us now; freed once.
    unsafe { libc::free(p.cast::<c_void>()) };
    Some(s)
}

/// The server log callback (`msc_set_log_cb`): `data` is the transaction's log callback
/// data, i.e. its `MatchReport`; `msg` is a NUL-terminated text line.
unsafe extern "C" fn log_callback(data: *mut c_void, msg: *const c_void) {
    if data.is_null() || msg.is_null() {
        return;
    }
    // Never unwind into C++.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: libmodsecurity passes the text line as a NUL-terminated C string that is
        // alive during the callback.
        let line = unsafe { CStr::from_ptr(msg.cast::<c_char>()) }.to_string_lossy();
        // SAFETY: `data` is the report pointer this crate gave msc_new_transaction; the
        // callback runs synchronously inside a `&mut Transaction` method, on that thread,
        // so this is the only live reference to the report.
        let report = unsafe { &mut *data.cast::<MatchReport>() };
        report.record_line(&line, false);
    }));
}

#[cfg(test)]
mod tests {
    use super::{on_rules_thread, release_of};

    fn here() -> (std::thread::ThreadId, Option<String>) {
        let t = std::thread::current();
        (t.id(), t.name().map(str::to_owned))
    }

    #[test]
    fn every_rule_set_job_runs_on_one_long_lived_thread() {
        let caller = here();
        let borrowed = String::from("kept by the caller");
        let first = on_rules_thread(|| (here(), borrowed.len()));
        let second = std::thread::spawn(|| on_rules_thread(here)).join().unwrap();
        assert_ne!(first.0 .0, caller.0, "the job ran on the caller's thread");
        assert_eq!(first.0 .1.as_deref(), Some("lastcall-rules"));
        assert_eq!(
            first.1,
            borrowed.len(),
            "the job borrows from the caller's frame"
        );
        assert_eq!(
            second.0, first.0 .0,
            "a job from another thread ran on a thread other than the first job's"
        );
    }

    #[test]
    fn a_job_from_the_rules_thread_runs_in_place() {
        // A rule set dropped by a job (a compile that fails) frees on the same thread: no
        // deadlock waiting for itself.
        let (outer, inner) = on_rules_thread(|| (here().0, on_rules_thread(|| here().0)));
        assert_eq!(outer, inner);
    }

    #[test]
    fn a_panicking_job_reaches_its_caller_and_the_thread_goes_on() {
        let panicked = std::panic::catch_unwind(|| on_rules_thread(|| panic!("job failed")));
        let message = panicked.expect_err("the panic did not reach the caller");
        assert_eq!(message.downcast_ref::<&str>(), Some(&"job failed"));
        assert_eq!(on_rules_thread(|| 7), 7);
    }

    #[test]
    fn release_is_read_from_who_am_i() {
        for (text, release) in [
            ("ModSecurity v3.0.9 (Linux)", "3.0.9"),
            ("ModSecurity v3.0.14 (Linux)", "3.0.14"),
            ("ModSecurity v3.0.16 (Linux)", "3.0.16"),
            ("ModSecurity v3.1.0-rc1 (Darwin)", "3.1.0-rc1"),
            ("ModSecurity (Linux)", ""),
            ("", ""),
        ] {
            assert_eq!(release_of(text), release, "{text:?}");
        }
    }
}
