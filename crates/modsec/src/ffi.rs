//! Raw declarations of the libmodsecurity 3 C API (`/usr/include/modsecurity/*.h`, 3.0.9).
//!
//! Only what the safe wrapper uses is declared. Every function here is `unsafe` to call;
//! the wrapper in `lib.rs` states the invariants at each call site.

use std::os::raw::{c_char, c_int, c_uchar, c_void};

/// `ModSecurity` (modsecurity.h): the engine object.
#[repr(C)]
pub(crate) struct ModSecurityT {
    _private: [u8; 0],
    _pin: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
}

/// `RulesSet` (rules_set.h): a compiled rule set.
#[repr(C)]
pub(crate) struct RulesSetT {
    _private: [u8; 0],
    _pin: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
}

/// `Transaction` (transaction.h).
#[repr(C)]
pub(crate) struct TransactionT {
    _private: [u8; 0],
    _pin: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
}

/// `ModSecurityIntervention` (intervention.h). `url` and `log` are `malloc`ed by the
/// library and owned by the caller after `msc_intervention`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct ModSecurityIntervention {
    pub status: c_int,
    pub pause: c_int,
    pub url: *mut c_char,
    pub log: *mut c_char,
    pub disruptive: c_int,
}

/// `ModSecLogCb` (modsecurity.h): `(logCbData of the transaction, payload)`. With the C
/// API's `msc_set_log_cb`, the payload is a NUL-terminated text log line.
pub(crate) type ModSecLogCb = Option<unsafe extern "C" fn(*mut c_void, *const c_void)>;

extern "C" {
    pub(crate) fn msc_init() -> *mut ModSecurityT;
    pub(crate) fn msc_who_am_i(msc: *mut ModSecurityT) -> *const c_char;
    pub(crate) fn msc_set_connector_info(msc: *mut ModSecurityT, connector: *const c_char);
    pub(crate) fn msc_set_log_cb(msc: *mut ModSecurityT, cb: ModSecLogCb);
    pub(crate) fn msc_cleanup(msc: *mut ModSecurityT);

    pub(crate) fn msc_create_rules_set() -> *mut RulesSetT;
    pub(crate) fn msc_rules_add_file(
        rules: *mut RulesSetT,
        file: *const c_char,
        error: *mut *const c_char,
    ) -> c_int;
    pub(crate) fn msc_rules_add(
        rules: *mut RulesSetT,
        plain_rules: *const c_char,
        error: *mut *const c_char,
    ) -> c_int;
    pub(crate) fn msc_rules_cleanup(rules: *mut RulesSetT) -> c_int;

    pub(crate) fn msc_new_transaction(
        ms: *mut ModSecurityT,
        rules: *mut RulesSetT,
        log_cb_data: *mut c_void,
    ) -> *mut TransactionT;
    pub(crate) fn msc_new_transaction_with_id(
        ms: *mut ModSecurityT,
        rules: *mut RulesSetT,
        id: *mut c_char,
        log_cb_data: *mut c_void,
    ) -> *mut TransactionT;
    pub(crate) fn msc_process_connection(
        t: *mut TransactionT,
        client: *const c_char,
        c_port: c_int,
        server: *const c_char,
        s_port: c_int,
    ) -> c_int;
    pub(crate) fn msc_process_uri(
        t: *mut TransactionT,
        uri: *const c_char,
        protocol: *const c_char,
        http_version: *const c_char,
    ) -> c_int;
    pub(crate) fn msc_add_n_request_header(
        t: *mut TransactionT,
        key: *const c_uchar,
        len_key: usize,
        value: *const c_uchar,
        len_value: usize,
    ) -> c_int;
    pub(crate) fn msc_process_request_headers(t: *mut TransactionT) -> c_int;
    pub(crate) fn msc_append_request_body(
        t: *mut TransactionT,
        body: *const c_uchar,
        size: usize,
    ) -> c_int;
    pub(crate) fn msc_process_request_body(t: *mut TransactionT) -> c_int;
    pub(crate) fn msc_add_n_response_header(
        t: *mut TransactionT,
        key: *const c_uchar,
        len_key: usize,
        value: *const c_uchar,
        len_value: usize,
    ) -> c_int;
    pub(crate) fn msc_process_response_headers(
        t: *mut TransactionT,
        code: c_int,
        protocol: *const c_char,
    ) -> c_int;
    pub(crate) fn msc_append_response_body(
        t: *mut TransactionT,
        body: *const c_uchar,
        size: usize,
    ) -> c_int;
    pub(crate) fn msc_process_response_body(t: *mut TransactionT) -> c_int;
    pub(crate) fn msc_process_logging(t: *mut TransactionT) -> c_int;
    pub(crate) fn msc_update_status_code(t: *mut TransactionT, status: c_int) -> c_int;
    pub(crate) fn msc_intervention(t: *mut TransactionT, it: *mut ModSecurityIntervention)
        -> c_int;
    pub(crate) fn msc_get_request_body_length(t: *mut TransactionT) -> usize;
    pub(crate) fn msc_transaction_cleanup(t: *mut TransactionT);
}
