// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// lastcall-turn's kernel fast path: a tc (clsact/TCX) ingress program that relays the
// ChannelData of UDP allocations with a channel binding, both directions, without waking the
// daemon:
//
//   client -> listener   ChannelData(channel, data)  =>  relay -> peer    data
//   peer   -> relay      data                        =>  listener -> client  ChannelData
//
// The daemon owns the two maps (one entry per direction of each channel binding, with an
// expiry in CLOCK_MONOTONIC nanoseconds and per-entry counters). Whatever does not match an
// entry that is still valid, or that this program does not handle (IP options, fragments,
// padded ChannelData, GSO packets, a destination the FIB cannot reach directly), is handed on
// unchanged (TC_ACT_UNSPEC: the next filter, then the stack and the daemon).
//
// The UDP checksum is updated incrementally with bpf_l4_csum_replace: for CHECKSUM_PARTIAL
// packets (loopback, local senders) only the pseudo-header part is kept in the field, as the
// stack expects; for full checksums every change (addresses, ports, length, the 4 bytes of
// ChannelData header added or removed) is folded in. A zero UDP checksum stays zero.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#ifndef AF_INET
#define AF_INET 2
#endif

#define ETH_LEN 14
#define IP_LEN 20
#define IP_OFF ETH_LEN
#define UDP_OFF (ETH_LEN + IP_LEN)
#define UDP_CSUM_OFF (UDP_OFF + 6)
#define IP_CSUM_OFF (IP_OFF + 10)
#define CD_LEN 4
#define MAX_ENTRIES 65536

// Client -> peer: the client's 5-tuple and channel (network byte order but the channel).
struct to_peer_key {
	__be32 client_ip;
	__be32 server_ip;
	__be16 client_port;
	__be16 server_port;
	__u16 channel;
	__u16 pad;
};

// Peer -> client: the peer and the relay address.
struct to_client_key {
	__be32 peer_ip;
	__be32 relay_ip;
	__be16 peer_port;
	__be16 relay_port;
};

// What a matching datagram becomes, until when, and what went through.
struct route {
	__be32 src_ip;
	__be32 dst_ip;
	__be16 src_port;
	__be16 dst_port;
	__u16 channel; // peer -> client: the channel to write
	__u16 pad;
	__u64 expires_ns;
	__u64 packets;
	__u64 bytes;   // UDP payload bytes received (what the daemon counts as bytes in)
	__u64 last_ns; // last datagram relayed
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENTRIES);
	__type(key, struct to_peer_key);
	__type(value, struct route);
} TO_PEER SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENTRIES);
	__type(key, struct to_client_key);
	__type(value, struct route);
} TO_CLIENT SEC(".maps");

// Why datagrams were handed on (per CPU): the daemon reads them for its metrics.
enum stat {
	STAT_TO_PEER = 0,
	STAT_TO_CLIENT,
	STAT_EXPIRED,
	STAT_UNHANDLED, // matched, but padded, GSO, too big or not routable here
	STAT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} STATS SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&STATS, &which);
	if (v)
		*v += 1;
}

// Where the rewritten datagram goes: 0 = up the local stack (TC_ACT_OK), > 0 = redirected
// out of that interface (MAC addresses written), < 0 = hand it on unchanged.
static __always_inline int route_out(struct __sk_buff *skb, const struct route *r,
				     __u16 tot_len, struct bpf_fib_lookup *fib)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET;
	fib->l4_protocol = IPPROTO_UDP;
	fib->sport = r->src_port;
	fib->dport = r->dst_port;
	fib->tot_len = tot_len;
	fib->ipv4_src = r->src_ip;
	fib->ipv4_dst = r->dst_ip;
	fib->ifindex = skb->ingress_ifindex;
	long rc = bpf_fib_lookup(skb, fib, sizeof(*fib), BPF_FIB_LOOKUP_OUTPUT);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return 0; // a local address: deliver here
	if (rc == BPF_FIB_LKUP_RET_SUCCESS)
		return fib->ifindex;
	return -1; // no neighbour yet, MTU, blackhole...: the daemon sends it
}

// The checksum changes common to both directions: addresses and length in the pseudo header
// and the IP header, ports and length in the UDP header.
static __always_inline int rewrite_headers(struct __sk_buff *skb, __be32 old_src, __be32 old_dst,
					   __be16 old_sport, __be16 old_dport, __be16 old_ulen,
					   __be16 old_tot, const struct route *r, __u16 ulen)
{
	__be16 new_ulen = bpf_htons(ulen);
	__be16 new_tot = bpf_htons(ulen + IP_LEN);
	__u64 f = BPF_F_MARK_MANGLED_0;

	// IP header.
	if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_src, r->src_ip, 4) ||
	    bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_dst, r->dst_ip, 4) ||
	    bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_tot, new_tot, 2))
		return -1;
	if (bpf_skb_store_bytes(skb, IP_OFF + 12, &r->src_ip, 4, 0) ||
	    bpf_skb_store_bytes(skb, IP_OFF + 16, &r->dst_ip, 4, 0) ||
	    bpf_skb_store_bytes(skb, IP_OFF + 2, &new_tot, 2, 0))
		return -1;
	// UDP: pseudo header, then header fields.
	if (bpf_l4_csum_replace(skb, UDP_CSUM_OFF, old_src, r->src_ip, f | BPF_F_PSEUDO_HDR | 4) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, old_dst, r->dst_ip, f | BPF_F_PSEUDO_HDR | 4) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, old_ulen, new_ulen, f | BPF_F_PSEUDO_HDR | 2) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, old_sport, r->src_port, f | 2) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, old_dport, r->dst_port, f | 2) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, old_ulen, new_ulen, f | 2))
		return -1;
	if (bpf_skb_store_bytes(skb, UDP_OFF, &r->src_port, 2, 0) ||
	    bpf_skb_store_bytes(skb, UDP_OFF + 2, &r->dst_port, 2, 0) ||
	    bpf_skb_store_bytes(skb, UDP_OFF + 4, &new_ulen, 2, 0))
		return -1;
	return 0;
}

static __always_inline int finish(struct __sk_buff *skb, int out, struct bpf_fib_lookup *fib)
{
	if (out == 0)
		return TC_ACT_OK;
	if (bpf_skb_store_bytes(skb, 0, fib->dmac, 6, 0) ||
	    bpf_skb_store_bytes(skb, 6, fib->smac, 6, 0))
		return TC_ACT_SHOT; // headers already rewritten: cannot be handed on
	return bpf_redirect(out, 0);
}

// Client ChannelData -> the peer's datagram (4 bytes shorter).
static __always_inline int to_peer(struct __sk_buff *skb, struct iphdr *ip, struct udphdr *udp,
				   __u16 ulen, void *end)
{
	__u8 *cd = (void *)(udp + 1);
	if ((void *)(cd + CD_LEN) > end)
		return TC_ACT_UNSPEC;
	__u16 channel = ((__u16)cd[0] << 8) | cd[1];
	__u16 len = ((__u16)cd[2] << 8) | cd[3];
	if (channel < 0x4000 || channel > 0x7fff)
		return TC_ACT_UNSPEC;
	struct to_peer_key key = {
		.client_ip = ip->saddr,
		.server_ip = ip->daddr,
		.client_port = udp->source,
		.server_port = udp->dest,
		.channel = channel,
	};
	struct route *r = bpf_map_lookup_elem(&TO_PEER, &key);
	if (!r)
		return TC_ACT_UNSPEC;
	__u64 now = bpf_ktime_get_ns();
	if (now >= r->expires_ns) {
		count(STAT_EXPIRED);
		return TC_ACT_UNSPEC;
	}
	// Padding (allowed over UDP) or a short datagram: the daemon decides.
	if (len + CD_LEN + sizeof(struct udphdr) != ulen || skb->gso_segs > 1) {
		count(STAT_UNHANDLED);
		return TC_ACT_UNSPEC;
	}
	__u16 new_ulen = ulen - CD_LEN;
	struct bpf_fib_lookup fib;
	int out = route_out(skb, r, new_ulen + IP_LEN, &fib);
	if (out < 0) {
		count(STAT_UNHANDLED);
		return TC_ACT_UNSPEC;
	}
	__be32 old_src = ip->saddr, old_dst = ip->daddr;
	__be16 old_sport = udp->source, old_dport = udp->dest, old_ulen = udp->len;
	__be16 old_tot = ip->tot_len, old_csum = udp->check;
	__be32 old_cd = *(__be32 *)cd;
	// Remove the 4 bytes after the IP header: the old source and destination ports. What
	// was the old length, checksum and ChannelData header becomes the new UDP header.
	if (bpf_skb_adjust_room(skb, -CD_LEN, BPF_ADJ_ROOM_NET, 0)) {
		count(STAT_UNHANDLED);
		return TC_ACT_UNSPEC;
	}
	// The checksum field moves to its place; the ChannelData header leaves the sum.
	if (bpf_skb_store_bytes(skb, UDP_CSUM_OFF, &old_csum, 2, 0) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, old_cd, 0, BPF_F_MARK_MANGLED_0 | 4) ||
	    rewrite_headers(skb, old_src, old_dst, old_sport, old_dport, old_ulen, old_tot, r,
			    new_ulen))
		return TC_ACT_SHOT;
	__sync_fetch_and_add(&r->packets, 1);
	__sync_fetch_and_add(&r->bytes, len);
	r->last_ns = now;
	count(STAT_TO_PEER);
	return finish(skb, out, &fib);
}

// A peer's datagram -> ChannelData for the client (4 bytes longer).
static __always_inline int to_client(struct __sk_buff *skb, struct route *r, struct iphdr *ip,
				     struct udphdr *udp, __u16 ulen)
{
	__u64 now = bpf_ktime_get_ns();
	if (now >= r->expires_ns) {
		count(STAT_EXPIRED);
		return TC_ACT_UNSPEC;
	}
	if (ulen > 0xffff - CD_LEN - IP_LEN || skb->gso_segs > 1) {
		count(STAT_UNHANDLED);
		return TC_ACT_UNSPEC;
	}
	__u16 new_ulen = ulen + CD_LEN;
	struct bpf_fib_lookup fib;
	int out = route_out(skb, r, new_ulen + IP_LEN, &fib);
	if (out < 0) {
		count(STAT_UNHANDLED);
		return TC_ACT_UNSPEC;
	}
	__be32 old_src = ip->saddr, old_dst = ip->daddr;
	__be16 old_sport = udp->source, old_dport = udp->dest, old_ulen = udp->len;
	__be16 old_tot = ip->tot_len, old_csum = udp->check;
	__u16 payload = ulen - sizeof(struct udphdr);
	__be32 cd = bpf_htonl(((__u32)r->channel << 16) | payload);
	// 4 bytes after the IP header: the new UDP header is those and the old ports; the old
	// length and checksum become the ChannelData header.
	if (bpf_skb_adjust_room(skb, CD_LEN, BPF_ADJ_ROOM_NET, 0)) {
		count(STAT_UNHANDLED);
		return TC_ACT_UNSPEC;
	}
	if (bpf_skb_store_bytes(skb, UDP_CSUM_OFF, &old_csum, 2, 0) ||
	    bpf_skb_store_bytes(skb, UDP_OFF + 8, &cd, 4, 0) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, 0, cd, BPF_F_MARK_MANGLED_0 | 4) ||
	    rewrite_headers(skb, old_src, old_dst, old_sport, old_dport, old_ulen, old_tot, r,
			    new_ulen))
		return TC_ACT_SHOT;
	__sync_fetch_and_add(&r->packets, 1);
	__sync_fetch_and_add(&r->bytes, payload);
	r->last_ns = now;
	count(STAT_TO_CLIENT);
	return finish(skb, out, &fib);
}

SEC("classifier")
int lastcall_turn_ingress(struct __sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	if (skb->data_end - skb->data < UDP_OFF + sizeof(struct udphdr) + CD_LEN)
		bpf_skb_pull_data(skb, UDP_OFF + sizeof(struct udphdr) + CD_LEN);
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end)
		return TC_ACT_UNSPEC;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 || ip->version != 4 ||
	    ip->protocol != IPPROTO_UDP || (ip->frag_off & bpf_htons(0x3fff)))
		return TC_ACT_UNSPEC;
	__u16 ulen = bpf_ntohs(udp->len);
	if (ulen < sizeof(struct udphdr) || bpf_ntohs(ip->tot_len) != ulen + IP_LEN)
		return TC_ACT_UNSPEC;
	struct to_client_key ck = {
		.peer_ip = ip->saddr,
		.relay_ip = ip->daddr,
		.peer_port = udp->source,
		.relay_port = udp->dest,
	};
	struct route *r = bpf_map_lookup_elem(&TO_CLIENT, &ck);
	if (r)
		return to_client(skb, r, ip, udp, ulen);
	return to_peer(skb, ip, udp, ulen, end);
}

// The kernel wants a GPL-compatible licence for bpf_fib_lookup and friends; the file is
// GPL-2.0 OR Apache-2.0 (SPDX line above).
char LICENSE[] SEC("license") = "GPL";
