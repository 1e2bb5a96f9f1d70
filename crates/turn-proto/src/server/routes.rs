//! The fast path's routes ([`crate::fastpath`]): computed from an allocation's channels,
//! permissions and lifetime whenever one of them changes.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use super::{Allocation, Channel, Server};
use crate::fastpath::{ChannelRoute, PermissionRoute, RouteChange};
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

    /// Queues the routes of allocation `idx`'s live channels and permissions, with their
    /// current expiry.
    pub(super) fn publish_routes(&mut self, idx: usize, now: Instant) {
        let Some(queue) = self.routes.as_mut() else {
            return;
        };
        let Some(Some(a)) = self.allocs.get(idx) else {
            return;
        };
        let data_indications = !self.config.fingerprint;
        for c in a.channels.iter().filter(|c| c.expires > now) {
            if let Some(route) = route_of(a, c) {
                queue.push_back(RouteChange::Install(route));
            }
        }
        for &(peer, exp) in a.perms.iter().filter(|(_, exp)| *exp > now) {
            if let Some(relay) = carried(a, peer) {
                queue.push_back(RouteChange::InstallPermission(PermissionRoute {
                    client: a.client,
                    relay,
                    peer,
                    data_indications,
                    expires: a.expires.min(exp),
                }));
            }
        }
    }

    /// Queues the removal of `a`'s routes for `channels` and `perms` (deleted allocation,
    /// forgotten channels, expired permissions).
    pub(super) fn unpublish_routes<'c>(
        routes: &mut Option<VecDeque<RouteChange>>,
        a: &Allocation,
        channels: impl IntoIterator<Item = &'c Channel>,
        perms: impl IntoIterator<Item = IpAddr>,
    ) {
        let Some(queue) = routes.as_mut() else {
            return;
        };
        for c in channels {
            if let Some(relay) = carried(a, c.peer.ip()) {
                queue.push_back(RouteChange::Remove {
                    client: a.client,
                    channel: c.number,
                    relay,
                    peer: c.peer,
                });
            }
        }
        for peer in perms {
            if let Some(relay) = carried(a, peer) {
                queue.push_back(RouteChange::RemovePermission {
                    client: a.client,
                    relay,
                    peer,
                });
            }
        }
    }
}

/// The relay address of allocation `a` towards `peer`, if the fast path may carry that
/// (whether or not it may now: that is the route's expiry): a UDP client, no bandwidth
/// limit, and client, listener and peer of the relay's family.
pub(super) fn carried(a: &Allocation, peer: IpAddr) -> Option<SocketAddr> {
    let v4 = peer.is_ipv4();
    if a.client.transport != Transport::Udp
        || a.bandwidth.is_some()
        || a.client.client.is_ipv4() != v4
        || a.client.local.is_ipv4() != v4
    {
        return None;
    }
    a.relays.for_family(v4)
}

/// The route of channel `c` of allocation `a`, if the fast path may carry it and the peer
/// has a permission.
fn route_of(a: &Allocation, c: &Channel) -> Option<ChannelRoute> {
    let relay = carried(a, c.peer.ip())?;
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

    use crate::fastpath::{ChannelRoute, PermissionRoute, RouteChange};
    use crate::stun::{attr, method};
    use crate::tests::{alice, base_config, udp, Req, H};
    use crate::{Bandwidth, ClientAddr, Transport};

    fn routes(h: &mut H) -> Vec<RouteChange> {
        std::iter::from_fn(|| h.server.poll_route()).collect()
    }

    fn bind(h: &mut H, from: ClientAddr, channel: u16, peer: &str) {
        h.authed(
            from,
            &alice(),
            Req::new(method::CHANNEL_BIND).channel(channel).peer(peer),
        );
    }

    fn permission(
        from: ClientAddr,
        relay: SocketAddr,
        peer: &str,
        expires: std::time::Instant,
    ) -> RouteChange {
        RouteChange::InstallPermission(PermissionRoute {
            client: from,
            relay,
            peer: peer.parse().unwrap(),
            data_indications: true,
            expires,
        })
    }

    /// A route per channel binding and per permission, its expiry the earliest of the
    /// allocation's, the channel's and the permission's; refreshed by ChannelBind,
    /// CreatePermission and Refresh; removed with the allocation.
    #[test]
    fn routes_follow_bindings_permissions_and_the_allocation() {
        let mut h = H::new(base_config());
        h.server.set_route_output(true);
        let from = udp("192.0.2.7:40000");
        let relay = h.allocate(from, &alice());
        assert_eq!(routes(&mut h), vec![], "no channel or permission, no route");
        let peer: SocketAddr = "8.8.8.8:5000".parse().unwrap();
        bind(&mut h, from, 0x4001, "8.8.8.8:5000");
        // The permission (300 s) ends first.
        let perm_end = h.now + Duration::from_secs(300);
        let route = ChannelRoute {
            client: from,
            channel: 0x4001,
            relay,
            peer,
            expires: perm_end,
        };
        assert_eq!(
            routes(&mut h),
            vec![
                RouteChange::Install(route),
                permission(from, relay, "8.8.8.8", perm_end)
            ]
        );
        h.advance(100);
        h.authed(
            from,
            &alice(),
            Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:1"),
        );
        let perm_end = h.now + Duration::from_secs(300);
        let refreshed = ChannelRoute {
            expires: perm_end,
            ..route
        };
        let both = vec![
            RouteChange::Install(refreshed),
            permission(from, relay, "8.8.8.8", perm_end),
        ];
        assert_eq!(routes(&mut h), both);
        // A Refresh republishes (the permission still ends first).
        h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(600));
        assert_eq!(routes(&mut h), both);
        h.authed(from, &alice(), Req::new(method::REFRESH).lifetime(0));
        let gone = vec![
            RouteChange::Remove {
                client: from,
                channel: 0x4001,
                relay,
                peer,
            },
            RouteChange::RemovePermission {
                client: from,
                relay,
                peer: peer.ip(),
            },
        ];
        assert_eq!(routes(&mut h), gone);
    }

    /// A permission alone (Send and Data indications: Firefox binds no channel) gets its
    /// route; an expired one is removed; with `fingerprint` (the server adds FINGERPRINT to
    /// Data indications, which the fast path cannot) only the Send half may be relayed.
    #[test]
    fn permissions_get_routes_of_their_own() {
        let mut h = H::new(base_config());
        h.server.set_route_output(true);
        let from = udp("192.0.2.7:40000");
        let relay = h.allocate(from, &alice());
        h.authed(
            from,
            &alice(),
            Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:1"),
        );
        let end = h.now + Duration::from_secs(300);
        assert_eq!(
            routes(&mut h),
            vec![permission(from, relay, "8.8.8.8", end)]
        );
        h.advance(301);
        assert_eq!(
            routes(&mut h),
            vec![RouteChange::RemovePermission {
                client: from,
                relay,
                peer: "8.8.8.8".parse().unwrap(),
            }]
        );

        let mut config = base_config();
        config.fingerprint = true;
        let mut h = H::new(config);
        h.server.set_route_output(true);
        let from = udp("192.0.2.7:40000");
        h.allocate(from, &alice());
        h.authed(
            from,
            &alice(),
            Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:1").fp(),
        );
        assert!(
            matches!(
                routes(&mut h)[..],
                [RouteChange::InstallPermission(PermissionRoute {
                    data_indications: false,
                    ..
                })]
            ),
            "fingerprint on: no Data indications in the kernel"
        );
    }

    /// IPv6 end to end gets routes like IPv4; a route across families (an IPv4 client with
    /// an IPv6 relay) gets none: the fast path does not translate.
    #[test]
    fn ipv6_routes_and_none_across_families() {
        let mut h = H::new(base_config());
        h.server.set_route_output(true);
        let from6 = ClientAddr {
            transport: Transport::Udp,
            client: "[2001:db8:1::7]:40000".parse().unwrap(),
            local: "[2001:db8::1]:3478".parse().unwrap(),
        };
        let r = h.authed(
            from6,
            &alice(),
            Req::new(method::ALLOCATE)
                .transport_udp()
                .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
        );
        let relay6 = r.addr(attr::XOR_RELAYED_ADDRESS).unwrap();
        assert!(relay6.is_ipv6());
        bind(&mut h, from6, 0x4001, "[2606:4700::1111]:5000");
        let got = routes(&mut h);
        assert!(
            matches!(got[..], [RouteChange::Install(ChannelRoute { relay, .. }), RouteChange::InstallPermission(_)] if relay == relay6),
            "{got:?}"
        );

        // An IPv4 client asking for an IPv6 relay.
        let from = udp("192.0.2.8:40000");
        let r = h.authed(
            from,
            &alice(),
            Req::new(method::ALLOCATE)
                .transport_udp()
                .attr(attr::REQUESTED_ADDRESS_FAMILY, vec![2, 0, 0, 0]),
        );
        assert!(r.addr(attr::XOR_RELAYED_ADDRESS).unwrap().is_ipv6());
        bind(&mut h, from, 0x4002, "[2606:4700::1111]:5000");
        assert_eq!(routes(&mut h), vec![], "no route across families");
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
        assert_eq!(routes(&mut h).len(), 2);
        // Channel 600 s + quarantine 300 s: then it is forgotten and its route removed (the
        // permission, 300 s, went first).
        h.advance(301);
        assert!(matches!(
            routes(&mut h)[..],
            [RouteChange::RemovePermission { .. }]
        ));
        h.advance(600);
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

        let mut h = H::new(base_config());
        h.server.set_route_output(true);
        let tcp = ClientAddr {
            transport: Transport::Tcp,
            ..udp("192.0.2.7:40000")
        };
        h.allocate(tcp, &alice());
        bind(&mut h, tcp, 0x4001, "8.8.8.8:5000");
        assert_eq!(routes(&mut h), vec![], "TCP clients stay the core's");
    }
}
