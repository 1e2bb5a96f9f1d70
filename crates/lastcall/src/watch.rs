//! [`Watch`]: what one connection task holds to follow the lifecycle without reading the
//! phase in a dozen places. It wakes the task when something it must act on changes (the
//! phase, the exit decision, or whether a hold is left) and answers the two questions a task asks then: is new work
//! refused ([`Watch::is_refusing`]), and must I close now ([`Watch::is_exiting`]).
//!
//! One naming across [`Handle`], [`Watch`] and [`Seen`]: a state is read with `is_*` (a
//! bool, now); a future is named for the event it waits for ([`Handle::refusing`],
//! [`Handle::exiting`], [`Watch::changed`]), as tokio's `is_closed()` and `closed()`.
//!
//! ```no_run
//! # async fn conn(mut watch: lastcall::Watch, mut read: impl FnMut() -> std::future::Ready<Option<u8>>) {
//! loop {
//!     tokio::select! {
//!         byte = read() => match byte {
//!             Some(_) => { /* serve it */ }
//!             None => break,
//!         },
//!         _ = watch.changed() => {
//!             if watch.is_exiting() {
//!                 break; // the deadline (or a forced exit): say goodbye, close
//!             }
//!             if watch.is_refusing() {
//!                 // refuse new work on this connection from now on
//!             }
//!         }
//!     }
//! }
//! # }
//! ```

use tokio::sync::watch;

use crate::lifecycle::{Handle, State};

// The part of the lifecycle's state a connection follows; in `lastcall-phase`, which the
// sans-IO protocol cores use without tokio.
pub use lastcall_phase::Seen;

fn seen(state: &State) -> Seen {
    Seen {
        phase: state.phase,
        exiting: state.exiting,
        held: state.held,
    }
}

/// A per-connection view of the lifecycle ([`Handle::watch`]).
///
/// The accessors read the current state; [`changed`](Self::changed) resolves when it differs
/// from what `changed` last returned (or, the first time, from the state when the watch was
/// made).
#[derive(Debug, Clone)]
pub struct Watch {
    handle: Handle,
    rx: watch::Receiver<State>,
    last: Seen,
}

impl Handle {
    /// A watch on the phase for one connection task: [`Watch::changed`] wakes it when the
    /// phase changes or the exit is decided.
    pub fn watch(&self) -> Watch {
        let rx = self.subscribe();
        let last = seen(&rx.borrow());
        Watch {
            handle: self.clone(),
            rx,
            last,
        }
    }
}

impl Watch {
    /// The lifecycle's handle (sessions, refused-work counter, config).
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The current phase and exit decision.
    pub fn now(&self) -> Seen {
        seen(&self.rx.borrow())
    }

    /// Whether new work is refused now: [`Phase::Refusing`](crate::Phase::Refusing), or the exit is decided.
    /// (Never while Starting, Serving, Announcing or Lingering.)
    pub fn is_refusing(&self) -> bool {
        self.now().is_refusing()
    }

    /// Whether the exit is decided: close what is left, now.
    pub fn is_exiting(&self) -> bool {
        self.now().is_exiting()
    }

    /// Resolves with the new state when the phase, the exit decision or whether a hold is
    /// left changes. Cancel-safe
    /// (use it in `select!`); once exiting nothing changes any more and it never resolves.
    pub async fn changed(&mut self) -> Seen {
        let last = self.last;
        let seen = self
            .rx
            .wait_for(|s| seen(s) != last)
            .await
            .map(|state| seen(&state));
        match seen {
            Ok(seen) => {
                self.last = seen;
                seen
            }
            // The lifecycle is gone (never while a handle lives, and this watch holds one).
            Err(_) => std::future::pending().await,
        }
    }
}
