//! One NOTIFY's life, and the guards that hold it: what a NOTIFY holds is created here, in
//! [`Notify::received`], and released here, when the [`Notify`] (or the [`Queued`] it
//! becomes) is dropped.
//!
//! | stage | what it holds | released |
//! |---|---|---|
//! | received (decoded by the `Conn`) | its [`Ticket`] (the ACK HAProxy waits for; `spoa_inflight` one higher through its [`GaugeGuard`](super::GaugeGuard)), its [`Charge`] (its bytes, under `max_buffered_bytes`) | — |
//! | answered here (inline, or at once while the pool is saturated with runaways) | the same | the ticket by its ACK; the charge right after |
//! | queued on the pool ([`Queued`]) | its [`Owed`] (the ticket, and its deadline on the budget's watchdog), the pool's [`Tracked`](super::pool::Tracked) state, its place among the connection's evaluations ([`Running`]), its charge | — |
//! | evaluating (on a pool thread) | the same | — |
//! | answered | by its evaluation ([`Owed::send`]), or at the deadline by the watchdog with the failure verdict; dropped unanswered, the ticket sends the error variable | the ticket (and `spoa_inflight`) |
//! | released (its evaluation ended, or was skipped: answered while queued) | nothing | the charge, its place among the connection's evaluations, the owed answer; the pool marks the job done |
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
use super::pool::{Evaluations, Running, Work};
use super::Engine;

/// A decoded NOTIFY, before it is answered or queued.
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
        let owed = engine.budget.owe(ticket, id, Instant::now());
        let queued = Queued {
            messages,
            frame_size,
            owed,
            charge,
            running: Evaluations::start(evaluations),
        };
        Route::Queued(queued.into_work(engine))
    }
}

/// A NOTIFY queued on the pool, until its evaluation ends (or is skipped).
struct Queued {
    messages: Vec<Message>,
    frame_size: u32,
    /// Its answer, owed by its evaluation or, at the deadline, by the watchdog.
    owed: Arc<Owed>,
    /// Its bytes.
    charge: Charge,
    /// Its place among its connection's evaluations.
    running: Running,
}

impl Queued {
    /// Its evaluation, to run on an evaluation thread.
    fn into_work(self, engine: &Engine) -> Work {
        let handler: Arc<dyn Handler> = Arc::clone(&engine.handler);
        let metrics = Arc::clone(&engine.metrics);
        let tracked = self.owed.tracked();
        Work::tracked(move || self.evaluate(&*handler, &metrics), tracked)
    }

    /// Evaluates it, skipped if its answer went out already (at its deadline, while it was
    /// queued); everything it holds is released when this returns.
    fn evaluate(self, handler: &dyn Handler, metrics: &crate::metrics::Metrics) {
        let Queued {
            messages,
            frame_size,
            owed,
            charge: _charge,
            running: _running,
        } = self;
        if owed.answered() {
            return;
        }
        let answer = handler.handle_framed(&messages, frame_size);
        metrics.observe(owed.received().elapsed().as_secs_f64());
        owed.send(&answer.vars);
        // Phase 5 and cleanup, now that the ACK is on its way.
        answer.later.run();
    }
}
