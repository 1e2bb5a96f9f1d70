//! Refresh, CreatePermission and ChannelBind: the requests that change what an existing
//! allocation relays, and for how long.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use super::dispatch::{Attrs, Authed, Ctx};
use super::Reply;
use super::{Allocation, Channel, Server, FAMILY_V4, FAMILY_V6};
use crate::frame::channel_in_range;
use crate::stun::{attr, decode_address, Message};
use crate::types::{ClientAddr, DeleteReason, Event};

impl Server {
    pub(super) fn refresh(
        &mut self,
        now: Instant,
        idx: usize,
        attrs: &Attrs<'_>,
        authed: Option<Authed>,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        let Some(Some(a)) = self.allocs.get(idx) else {
            return self.error(ctx, 437, out);
        };
        if let Some(f) = attrs.family {
            let has = match f {
                FAMILY_V4 => a.relays.v4.is_some(),
                FAMILY_V6 => a.relays.v6.is_some(),
                _ => false,
            };
            if !has {
                return self.error(ctx, 443, out);
            }
        }
        if attrs.lifetime == Some(0) {
            self.delete(idx, DeleteReason::Refreshed);
            return self.success(ctx, out, |b| {
                b.u32(attr::LIFETIME, 0);
            });
        }
        let life = self.lifetime(attrs.lifetime, authed.as_ref().and_then(|a| a.expiry), now);
        if life.is_zero() {
            return self.error(ctx, 401, out);
        }
        let lifetime = u32::try_from(life.as_secs()).unwrap_or(u32::MAX);
        if let Some(Some(a)) = self.allocs.get_mut(idx) {
            a.expires = now + life;
            a.lifetime = lifetime;
        }
        self.reschedule(idx, now);
        self.publish_routes(idx, now);
        self.success(ctx, out, |b| {
            b.u32(attr::LIFETIME, lifetime);
        })
    }

    pub(super) fn create_permission(
        &mut self,
        now: Instant,
        idx: usize,
        from: &ClientAddr,
        msg: &Message<'_>,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        let txid = msg.transaction_id();
        let mut peers: Vec<SocketAddr> = Vec::new();
        let mut after_integrity = false;
        for at in msg.attributes() {
            match at.typ {
                attr::MESSAGE_INTEGRITY | attr::MESSAGE_INTEGRITY_SHA256 => after_integrity = true,
                attr::XOR_PEER_ADDRESS if !after_integrity => {
                    if let Some(p) = decode_address(at.value, &txid, true) {
                        peers.push(p);
                    }
                }
                _ => {}
            }
        }
        if peers.is_empty() {
            return self.error(ctx, 400, out);
        }
        let Some(Some(a)) = self.allocs.get(idx) else {
            return self.error(ctx, 437, out);
        };
        if peers
            .iter()
            .any(|p| a.relays.for_family(p.is_ipv4()).is_none())
        {
            return self.error(ctx, 443, out);
        }
        for p in &peers {
            if let Err(reason) = self.config.peer_policy.check(p.ip()) {
                self.peer_denied(from, *p, reason);
                return self.error(ctx, 403, out);
            }
        }
        let new = peers
            .iter()
            .filter(|p| !a.perms.iter().any(|(ip, _)| *ip == p.ip()))
            .count();
        if a.perms.len() + new > self.config.max_permissions_per_allocation {
            return self.error(ctx, 508, out);
        }
        let exp = now + self.config.lifetimes.permission;
        if let Some(Some(a)) = self.allocs.get_mut(idx) {
            for p in &peers {
                install_permission(a, p.ip(), exp);
            }
        }
        self.reschedule(idx, now);
        self.publish_routes(idx, now);
        self.success(ctx, out, |_| {})
    }

    fn peer_denied(&mut self, client: &ClientAddr, peer: SocketAddr, reason: crate::DenyReason) {
        self.counters.peers_denied += 1;
        self.push_event(Event::PeerDenied {
            client: *client,
            peer,
            reason,
        });
    }

    pub(super) fn channel_bind(
        &mut self,
        now: Instant,
        idx: usize,
        from: &ClientAddr,
        attrs: &Attrs<'_>,
        ctx: &Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        let (Some(number), Some(peer)) = (attrs.channel, attrs.peer) else {
            return self.error(ctx, 400, out);
        };
        if !channel_in_range(number) || attrs.peer_count != 1 {
            return self.error(ctx, 400, out);
        }
        let Some(Some(a)) = self.allocs.get(idx) else {
            return self.error(ctx, 437, out);
        };
        if a.relays.for_family(peer.is_ipv4()).is_none() {
            return self.error(ctx, 443, out);
        }
        if let Err(reason) = self.config.peer_policy.check(peer.ip()) {
            self.peer_denied(from, peer, reason);
            return self.error(ctx, 403, out);
        }
        // A channel (even expired, within its quarantine) is bound to one peer, and a peer to
        // one channel.
        let by_number = a.channels.iter().position(|c| c.number == number);
        let by_peer = a.channels.iter().position(|c| c.peer == peer);
        if by_number != by_peer {
            return self.error(ctx, 400, out);
        }
        if by_number.is_none() && a.channels.len() >= self.config.max_channels_per_allocation {
            return self.error(ctx, 508, out);
        }
        let chan_exp = now + self.config.lifetimes.channel;
        let perm_exp = now + self.config.lifetimes.permission;
        if let Some(Some(a)) = self.allocs.get_mut(idx) {
            match by_number.and_then(|i| a.channels.get_mut(i)) {
                Some(c) => c.expires = chan_exp,
                None => a.channels.push(Channel {
                    number,
                    peer,
                    expires: chan_exp,
                }),
            }
            install_permission(a, peer.ip(), perm_exp);
        }
        self.reschedule(idx, now);
        self.publish_routes(idx, now);
        self.success(ctx, out, |_| {})
    }
}

fn install_permission(a: &mut Allocation, ip: IpAddr, exp: Instant) {
    match a.perms.iter_mut().find(|(p, _)| *p == ip) {
        Some(p) => p.1 = p.1.max(exp),
        None => a.perms.push((ip, exp)),
    }
}
