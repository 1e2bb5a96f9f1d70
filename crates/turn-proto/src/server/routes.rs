//! The fast path's routes ([`crate::fastpath`]): computed from an allocation's channels,
//! permissions and lifetime whenever one of them changes.

use std::time::Instant;

use super::{Allocation, Channel, Server};
use crate::fastpath::{ChannelRoute, RouteChange};
use crate::types::Transport;

impl Server {
    /// Turns the route output on (`true`) or off: [`poll_route`](Self::poll_route) then
    /// yields every change to the fast path's routes. Turning it off forgets what is queued.
    pub fn set_route_output(&mut self, on: bool) {
        self.routes = on.then(Default::default);
    }

    /// The next change to the fast path's routes (with [`set_route_output`](Self::set_route_output)).
    pub fn poll_route(&mut self) -> Option<RouteChange> {
        self.routes.as_mut()?.pop_front()
    }

    /// Queues the routes of allocation `idx`'s live channels, with their current expiry.
    pub(super) fn publish_routes(&mut self, idx: usize, now: Instant) {
        let Some(queue) = self.routes.as_mut() else {
            return;
        };
        let Some(Some(a)) = self.allocs.get(idx) else {
            return;
        };
        for c in a.channels.iter().filter(|c| c.expires > now) {
            if let Some(route) = route_of(a, c) {
                queue.push_back(RouteChange::Install(route));
            }
        }
    }

    /// Queues the removal of `a`'s routes for `channels` (deleted allocation, forgotten
    /// channels).
    pub(super) fn unpublish_routes<'c>(
        routes: &mut Option<std::collections::VecDeque<RouteChange>>,
        a: &Allocation,
        channels: impl IntoIterator<Item = &'c Channel>,
    ) {
        let Some(queue) = routes.as_mut() else {
            return;
        };
        for c in channels {
            if let Some(relay) = carried(a, c) {
                queue.push_back(RouteChange::Remove {
                    client: a.client,
                    channel: c.number,
                    relay,
                    peer: c.peer,
                });
            }
        }
    }
}

/// The relay address of channel `c` of allocation `a`, if the fast path may carry it
/// (whether or not it may now: that is the route's expiry).
fn carried(a: &Allocation, c: &Channel) -> Option<std::net::SocketAddr> {
    if a.client.transport != Transport::Udp
        || a.bandwidth.is_some()
        || !a.client.client.is_ipv4()
        || !a.client.local.is_ipv4()
        || !c.peer.is_ipv4()
    {
        return None;
    }
    a.relays.v4
}

/// The route of channel `c` of allocation `a`, if the fast path may carry it and the peer
/// has a permission.
fn route_of(a: &Allocation, c: &Channel) -> Option<ChannelRoute> {
    let relay = carried(a, c)?;
    let perm = a
        .perms
        .iter()
        .filter(|(ip, _)| *ip == c.peer.ip())
        .map(|(_, exp)| *exp)
        .max()?;
    Some(ChannelRoute {
        client: a.client,
        channel: c.number,
        relay,
        peer: c.peer,
        expires: a.expires.min(c.expires).min(perm),
    })
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use crate::fastpath::{ChannelRoute, RouteChange};
    use crate::stun::method;
    use crate::tests::{alice, base_config, udp, Req, H};
    use crate::Bandwidth;

    fn routes(h: &mut H) -> Vec<RouteChange> {
        std::iter::from_fn(|| h.server.poll_route()).collect()
    }

    fn bind(h: &mut H, from: crate::ClientAddr, channel: u16, peer: &str) {
        h.authed(
            from,
            &alice(),
            Req::new(method::CHANNEL_BIND).channel(channel).peer(peer),
        );
    }

    /// A route per channel binding, its expiry the earliest of the allocation's, the
    /// channel's and the permission's; refreshed by ChannelBind, CreatePermission and
    /// Refresh; removed with the allocation.
    #[test]
    fn routes_follow_bindings_permissions_and_the_allocation() {
        let mut h = H::new(base_config());
        h.server.set_route_output(true);
        let from = udp("192.0.2.7:40000");
        let relay = h.allocate(from, &alice());
        assert_eq!(routes(&mut h), vec![], "no channel, no route");
        let peer: SocketAddr = "8.8.8.8:5000".parse().unwrap();
        bind(&mut h, from, 0x4001, "8.8.8.8:5000");
        let route = ChannelRoute {
            client: from,
            channel: 0x4001,
            relay,
            peer,
            // The permission (300 s) ends first.
            expires: h.now + Duration::from_secs(300),
        };
        assert_eq!(routes(&mut h), vec![RouteChange::Install(route)]);
        h.advance(100);
        h.authed(
            from,
            &alice(),
            Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:1"),
        );
        let refreshed = ChannelRoute {
            expires: h.now + Duration::from_secs(300),
            ..route
        };
        assert_eq!(routes(&mut h), vec![RouteChange::Install(refreshed)]);
        // A Refresh republishes (the permission still ends first).
        h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(600));
        assert_eq!(routes(&mut h), vec![RouteChange::Install(refreshed)]);
        h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(0));
        let gone = RouteChange::Remove {
            client: from,
            channel: 0x4001,
            relay,
            peer,
        };
        assert_eq!(routes(&mut h), vec![gone]);
    }

    /// A channel forgotten after its quarantine is removed; TCP clients and bandwidth-limited
    /// allocations never get routes; without the output nothing is queued.
    #[test]
    fn what_the_fast_path_must_not_carry_gets_no_route() {
        let mut h = H::new(base_config());
        let from = udp("192.0.2.7:40000");
        h.allocate(from, &alice());
        bind(&mut h, from, 0x4001, "8.8.8.8:5000");
        assert_eq!(h.server.poll_route(), None, "output off");

        let mut h = H::new(base_config());
        h.server.set_route_output(true);
        let from = udp("192.0.2.7:40000");
        h.allocate(from, &alice());
        h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(3600));
        bind(&mut h, from, 0x4001, "8.8.8.8:5000");
        assert_eq!(routes(&mut h).len(), 1);
        // Channel 600 s + quarantine 300 s: then it is forgotten and its route removed.
        h.advance(901);
        let forgotten = routes(&mut h);
        assert!(
            matches!(
                forgotten[..],
                [RouteChange::Remove {
                    channel: 0x4001,
                    ..
                }]
            ),
            "{forgotten:?}"
        );

        let mut config = base_config();
        config.bandwidth = Bandwidth {
            max_bps: 1000,
            ..Default::default()
        };
        let mut h = H::new(config);
        h.server.set_route_output(true);
        let from = udp("192.0.2.7:40000");
        h.allocate(from, &alice());
        bind(&mut h, from, 0x4001, "8.8.8.8:5000");
        assert_eq!(routes(&mut h), vec![], "max-bps is the core's to enforce");
    }
}
