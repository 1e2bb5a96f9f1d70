//! What the engine asks of whoever evaluates NOTIFYs (the WAF, or a test's stand-in): a
//! blocking call from messages to the ACK's variables, plus the work that may wait until the
//! ACK is on its way, returned by value.

use spop::frame::Message;
use spop::TypedData;

/// Value of `txn.<prefix>.error` when the agent itself could not evaluate (the spec's
/// "unknown error"). HAProxy sets the same variable for its own SPOE errors, so one
/// `deny if { var(txn.coraza.error) -m int gt 0 }` covers both.
pub(crate) const AGENT_ERROR: i64 = 99;

/// The variables to set in HAProxy's transaction scope.
pub(crate) type Vars = Vec<(&'static str, TypedData)>;

/// The error answer: `error` set to [`AGENT_ERROR`].
pub(crate) fn error_vars() -> Vars {
    vec![("error", TypedData::Int64(AGENT_ERROR))]
}

/// Work that need not delay an ACK (ModSecurity's logging phase and a transaction's
/// cleanup): whoever holds it runs it once the ACK is written, by [`Later::run`] or by
/// dropping it. Held by value, so it cannot be lost, forgotten, or run on the wrong thread.
#[must_use = "run it (or drop it) after the ACK is written"]
pub(crate) struct Later(Option<Box<dyn FnOnce() + Send>>);

impl Later {
    /// Nothing left to do.
    pub(crate) fn none() -> Later {
        Later(None)
    }

    /// `work`, to run after the ACK.
    pub(crate) fn new(work: impl FnOnce() + Send + 'static) -> Later {
        Later(Some(Box::new(work)))
    }

    /// Whether there is work to run.
    pub(crate) fn is_pending(&self) -> bool {
        self.0.is_some()
    }

    /// Runs the work now.
    pub(crate) fn run(mut self) {
        if let Some(work) = self.0.take() {
            work();
        }
    }
}

impl Drop for Later {
    fn drop(&mut self) {
        if let Some(work) = self.0.take() {
            work();
        }
    }
}

impl std::fmt::Debug for Later {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Later").field(&self.is_pending()).finish()
    }
}

/// One evaluation's result: the ACK's variables, and what to run once the ACK is written.
#[derive(Debug)]
pub struct Answer {
    /// The variables to set.
    pub(crate) vars: Vars,
    /// Deferred work.
    pub(crate) later: Later,
}

impl From<Vars> for Answer {
    fn from(vars: Vars) -> Answer {
        Answer {
            vars,
            later: Later::none(),
        }
    }
}

/// Blocking evaluation of one NOTIFY's messages.
pub trait Handler: Send + Sync + 'static {
    /// Evaluates the messages (blocking, CPU-bound: called on an evaluation thread, or on an
    /// I/O thread under a claim on the pool's room).
    fn handle(&self, messages: &[Message]) -> Answer;

    /// [`handle`](Self::handle), told the connection's negotiated `max-frame-size` (HAProxy
    /// announces `tune.bufsize - 4`: how much of a body its buffer can hold).
    fn handle_framed(&self, messages: &[Message], _frame_size: u32) -> Answer {
        self.handle(messages)
    }

    /// The ACK's variables when no message needs any engine work (cheap, non-blocking:
    /// called on the connection task before any hand-off); `None` when
    /// [`handle`](Self::handle) must run.
    fn answer_inline(&self, _messages: &[Message]) -> Option<Vars> {
        None
    }

    /// Names the NOTIFY's transaction before it is evaluated (cheap, on the connection
    /// task), so that an answer given for it at the deadline and the log line say which it
    /// was; may fix the id in the messages (an id generated here is the one evaluated).
    fn identify(&self, _messages: &mut [Message]) -> Option<String> {
        None
    }
}
