//! One NOTIFY's life, in one record: everything a NOTIFY holds is created here and owned by
//! its record, first a [`Notify`] (received), then, if it needs an evaluation, a [`Queued`]
//! (on the pool, then evaluating); it is released here, when the record is answered or
//! dropped.
//!
//! ## What the record holds
//!
//! Each guard is a type of the module whose resource it holds back (their `Drop` touches that
//! module's private state), made only by the constructor named here, which only this module
//! calls:
//!
//! | piece | guard (module), made by | holds | released |
//! |---|---|---|---|
//! | its ACK | [`Ticket`] (`ack`), [`AckSink::ticket`] | the ACK HAProxy waits for; `spoa_inflight` one higher | by [`Ticket::send`] (the gauge, then the ACK); dropped unsent, it sends the error variable |
//! | its bytes | [`Charge`] (`memory`), [`Memory::charge`](super::memory::Memory::charge) | its decoded messages' size, under `max_buffered_bytes` | dropped |
//! | its answer, once queued | [`Owed`] (`budget`), [`Budget::owe`](super::budget::Budget::owe) | the ticket, shared with the watchdog, which sends the failure verdict at the deadline | by [`Owed::send`] (the evaluation's, or the watchdog's); dropped by the last of the two, an unsent ticket sends the error variable |
//! | its job's state, once queued | [`Tracked`] (`pool`), `Tracked::default` | queued, running, overrun: what the pool and the watchdog share | done when its job ends on its thread |
//! | its place, once queued | [`Running`] (`pool`), [`Evaluations::start`] | one of its connection's evaluations (reading pauses at the bound) | dropped |
//!
//! ## In which order they are released
//!
//! - **Answered here** ([`Notify::route`]: inline, or at once while the pool is saturated
//!   with runaways): the ticket by its ACK, then the charge.
//! - **Evaluated** ([`Queued::evaluate`]): the ACK by [`Owed::send`], then the work that
//!   waits for it (phase 5, cleanup), then its place among the connection's evaluations, its
//!   charge, its share of the owed answer; then the pool marks its job done.
//! - **Skipped** (answered at its deadline by the watchdog while still queued): the same
//!   releases, without the evaluation.
//! - **Dropped unrun** (the pool's queue closed, or the connection's task ended while it
//!   waited for room in the queue): in [`Queued`]'s field order, its share of the owed answer
//!   (the last share sends the error variable), its charge, its place.
//!
//! A NOTIFY answered at its deadline still runs to its end and still counts among its
//! connection's evaluations and in `max_buffered_bytes` until then.
//!
//! No evaluation runs on an I/O thread: an evaluation there held that thread, and when the
//! runtime's other threads were parked nobody polled the I/O driver for as long (measured: a
//! 6 s evaluation delayed `/livez` by 6 s and the SIGTERM by 12 s). Only an answer that needs
//! no engine work ([`Handler::answer_inline`]) is given on the connection's task.

use std::sync::Arc;
use std::time::Instant;

use spop::frame::Message;

use super::ack::{AckSink, Ticket};
use super::budget::{failure_vars, Owed};
use super::handler::Handler;
use super::memory::Charge;
use super::pool::{Evaluations, Running, Tracked, Work};
use super::Engine;

/// A NOTIFY received (decoded by the `Conn`), before it is answered or queued. Dropped, its
/// fields are released in this order.
pub(super) struct Notify {
    messages: Vec<Message>,
    /// The connection's negotiated frame size (its ACK's limit, and its evaluation's).
    frame_size: u32,
    /// The ACK owed for it.
    ticket: Ticket,
    /// Its bytes.
    charge: Charge,
}

/// What the connection task tells of a decoded NOTIFY.
pub(super) struct Received<'a> {
    pub(super) stream_id: u64,
    pub(super) frame_id: u64,
    pub(super) messages: Vec<Message>,
    /// Its frame's size, charged until it is released.
    pub(super) size: usize,
    /// The connection's negotiated frame size (its ACK's limit).
    pub(super) max_frame_size: u32,
    /// Where its ACK goes.
    pub(super) sink: &'a Arc<AckSink>,
}

/// Where a NOTIFY went.
pub(super) enum Route {
    /// It is answered already.
    Answered,
    /// Its evaluation, for the pool.
    Queued(Work),
}

impl Notify {
    /// The NOTIFY is received: its ACK is owed and its bytes are held from now on.
    pub(super) fn received(engine: &Engine, r: Received<'_>) -> Notify {
        Notify {
            ticket: r.sink.ticket(
                r.stream_id,
                r.frame_id,
                r.max_frame_size,
                &engine.metrics.inflight,
            ),
            charge: engine.memory.charge(r.size),
            messages: r.messages,
            frame_size: r.max_frame_size,
        }
    }

    /// Answers it here if it needs no engine work (and `inline`: the `Conn` allows it), at
    /// once with the failure verdict while the pool is saturated with runaways; otherwise
    /// its evaluation, owed within the budget and counted among `evaluations`.
    pub(super) fn route(
        self,
        engine: &Engine,
        inline: bool,
        evaluations: &Arc<Evaluations>,
    ) -> Route {
        let Notify {
            mut messages,
            frame_size,
            ticket,
            charge,
        } = self;
        if inline {
            if let Some(vars) = engine.handler.answer_inline(&messages) {
                engine.metrics.observe(0.0);
                ticket.send(&vars);
                return Route::Answered;
            }
        }
        let id = engine.handler.identify(&mut messages);
        if engine.pool.saturated() {
            engine.metrics.failed_closed("overloaded");
            tracing::warn!(
                tx = id.as_deref().unwrap_or("-"),
                overrunning = engine.pool.overrunning(),
                "max_overruns evaluations are running past evaluation_timeout: answered at once with the error variable"
            );
            ticket.send(&failure_vars(id.as_deref()));
            return Route::Answered;
        }
        let tracked = Arc::new(Tracked::default());
        let owed = engine
            .budget
            .owe(ticket, id, Instant::now(), Arc::clone(&tracked));
        let queued = Queued {
            messages,
            frame_size,
            owed,
            charge,
            running: Evaluations::start(evaluations),
        };
        Route::Queued(queued.into_work(engine, tracked))
    }
}

/// A NOTIFY queued on the pool, until its evaluation ends (or is skipped). Dropped unrun,
/// its fields are released in this order.
struct Queued {
    messages: Vec<Message>,
    frame_size: u32,
    /// Its answer, owed by its evaluation or, at the deadline, by the watchdog (which holds
    /// the other share, and its job's [`Tracked`] state).
    owed: Arc<Owed>,
    /// Its bytes.
    charge: Charge,
    /// Its place among its connection's evaluations.
    running: Running,
}

impl Queued {
    /// Its evaluation, to run on an evaluation thread; `tracked` is its job's state.
    fn into_work(self, engine: &Engine, tracked: Arc<Tracked>) -> Work {
        let handler: Arc<dyn Handler> = Arc::clone(&engine.handler);
        let metrics = Arc::clone(&engine.metrics);
        Work::tracked(move || self.evaluate(&*handler, &metrics), tracked)
    }

    /// Evaluates it, skipped if its answer went out already (at its deadline, while it was
    /// queued); then releases everything it holds, in the module's order.
    fn evaluate(self, handler: &dyn Handler, metrics: &crate::metrics::Metrics) {
        let Queued {
            messages,
            frame_size,
            owed,
            charge,
            running,
        } = self;
        if !owed.answered() {
            let answer = handler.handle_framed(&messages, frame_size);
            metrics.observe(owed.received().elapsed().as_secs_f64());
            owed.send(&answer.vars);
            // Phase 5 and cleanup, now that the ACK is on its way.
            answer.later.run();
        }
        drop(running);
        drop(charge);
        drop(owed);
    }
}
