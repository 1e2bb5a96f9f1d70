//! The core's timers (a tokio task): allocations, permissions, channels, reservations and
//! waiting Allocates expire at [`Server::poll_timeout`](lastcall_turn_proto::Server::poll_timeout).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::shared::ServerState;

/// Timers are checked at least this often.
const TIMER_TICK: Duration = Duration::from_millis(500);

/// Expires what is due, forever.
pub(crate) async fn timer_loop(shared: Arc<ServerState>) {
    loop {
        let next = shared.run(|server| server.poll_timeout());
        let now = Instant::now();
        let wait = next
            .map(|t| t.saturating_duration_since(now))
            .unwrap_or(TIMER_TICK)
            .min(TIMER_TICK);
        tokio::time::sleep(wait).await;
        // What the kernel fast path relayed from clients, the core never saw: while a
        // drain reclaims idle allocations, tell it before it looks (read outside its lock).
        let heard = match shared.kernel() {
            Some(k) if shared.run(|server| reclaiming(server)) => k.client_activity(),
            _ => Vec::new(),
        };
        let now = Instant::now();
        shared.run(|server| {
            for (client, at) in &heard {
                server.note_client_activity(client, *at);
            }
            server.handle_timeout(now)
        });
    }
}

/// Whether the core reclaims idle allocations now (refusing, with `drain-idle-timeout`).
fn reclaiming(server: &lastcall_turn_proto::Server) -> bool {
    matches!(
        server.drain(),
        lastcall_turn_proto::DrainMode::Refuse { .. }
    ) && server.config().drain_idle_timeout.is_some()
}
