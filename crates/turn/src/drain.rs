//! The drain as the core sees it: from Refusing on, new Allocates get 300 Try Alternate (to
//! `--alternate-server` addresses that are not this server's own) or 403.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use lastcall_turn_proto::DrainMode;

use crate::shared::ServerState;

/// The alternates a server may send new clients to: one list serves every pod (a chart
/// renders one configuration), so a server skips its own addresses (listening or external)
/// on its own ports.
pub(crate) fn alternates(
    configured: &[SocketAddr],
    own_ips: &[IpAddr],
    own_ports: &[u16],
) -> Vec<SocketAddr> {
    configured
        .iter()
        .filter(|a| !(own_ips.contains(&a.ip()) && own_ports.contains(&a.port())))
        .copied()
        .collect()
}

/// Waits for Refusing, then makes the core refuse new Allocates. The lifecycle is read
/// through a [`Watch`](lastcall::Watch), as every connection of both daemons reads it.
pub(crate) async fn refuse_when_refusing(shared: Arc<ServerState>, alternates: Vec<SocketAddr>) {
    let mut watch = shared.handle().watch();
    let mut seen = watch.now();
    while !seen.is_refusing() {
        seen = watch.changed().await;
    }
    if seen.is_exiting() {
        return;
    }
    let n = alternates.len();
    shared.run(|server| server.set_drain(DrainMode::Refuse { alternates }));
    tracing::info!(
        alternates = n,
        "refusing new allocations ({}); existing allocations keep relaying",
        if n == 0 { "403" } else { "300 Try Alternate" }
    );
}
