// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// lastcall-turn's kernel fast path: a tc (clsact/TCX) ingress program that relays the data of
// UDP allocations both ways without waking the daemon, for IPv4 and IPv6 (each route is of
// one family end to end):
//
//   client -> listener  ChannelData(channel, data)          =>  relay -> peer  data
//   client -> listener  Send(XOR-PEER-ADDRESS, DATA, ...)   =>  relay -> peer  data
//   peer   -> relay     data, a channel bound to the peer   =>  listener -> client  ChannelData
//   peer   -> relay     data, a permission for its IP       =>  listener -> client  Data indication
//
// and when the peer is another allocation's relay address on this server (two clients of one
// server calling each other), the two hops in one pass: the client's ChannelData or Send
// becomes the other client's ChannelData or Data indication at once ("hairpin"), where the
// first hop's datagram, addressed to a local socket, would otherwise go up to the daemon.
//
// The daemon owns the maps: one entry per direction of each channel binding (TO_PEER,
// TO_CLIENT) and of each permission (SEND, DATA), each with an expiry in CLOCK_MONOTONIC
// nanoseconds and per-entry counters. Whatever does not match a valid entry, or that this
// program does not handle, is handed on unchanged (TC_ACT_UNSPEC: the next filter, then the
// stack and the daemon): STUN requests, unknown or expired routes, IP options, IPv6 extension
// headers, fragments, GSO packets (a same-host sender's UDP_SEGMENT batch: one packet here,
// which no helper can split into its datagrams), datagrams over MAX_DGRAM, Send indications
// with attributes the core would refuse, and destinations the FIB cannot reach directly.
//
// Checksums: for a packet from another host every change (addresses, ports and lengths in the
// pseudo header and the UDP header, the 4-byte-aligned bytes around the data that are added
// or removed) is folded into the UDP checksum with bpf_csum_diff and bpf_l4_csum_replace. The
// data never moves by other than a multiple of 4 bytes, so its share of the sum stays. A
// local sender's packet (CHECKSUM_PARTIAL: loopback, a container's veth) gets a full checksum
// instead, since moving its headers leaves its checksum start behind; such a packet is not
// sent out of another device (the daemon does that). A zero IPv4 UDP checksum stays zero.
// FINGERPRINT is not checked on a Send indication (the UDP checksum covers the bytes), nor
// written on a Data indication: the daemon installs no DATA route when `fingerprint` is on.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

#define ETH_LEN 14
#define IP4_LEN 20
#define IP6_LEN 40
#define UDP_LEN 8
#define CD_LEN 4
#define STUN_HDR 20
#define MAGIC 0x2112A442
#define MAX_ENTRIES 65536
// Largest UDP datagram (header included) handled; larger ones go to the daemon.
#define MAX_DGRAM 4096
// Bytes of STUN before the data of a Send indication handled (header, XOR-PEER-ADDRESS, the
// DATA attribute's header, DONT-FRAGMENT...), and after it (padding, FINGERPRINT, and the
// XOR-PEER-ADDRESS where it comes after DATA, as coturn's uclient puts it).
#define MAX_PREFIX 96
#define MAX_SUFFIX 60
#define MAX_ATTRS 6

#define ATTR_XOR_PEER 0x0012
#define ATTR_DATA 0x0013
#define ATTR_DONT_FRAGMENT 0x001A
#define ATTR_FINGERPRINT 0x8028
#define SEND_INDICATION 0x0016
#define DATA_INDICATION 0x0017

// Addresses are 16 bytes: IPv6, or IPv4-mapped (::ffff:a.b.c.d). Aligned to 4 for word
// access; every struct holding one has no padding (the daemon's mirrors are byte arrays).
struct addr {
	__u8 b[16];
} __attribute__((aligned(4)));

// Client -> peer, ChannelData: the client's 5-tuple and channel (host order).
struct to_peer_key {
	struct addr client_ip;
	struct addr server_ip;
	__be16 client_port;
	__be16 server_port;
	__u16 channel;
	__u16 pad;
};

// Client -> peer, Send indication: the client's 5-tuple and the permitted peer IP.
struct send_key {
	struct addr client_ip;
	struct addr server_ip;
	struct addr peer_ip;
	__be16 client_port;
	__be16 server_port;
};

// Peer -> client, ChannelData: the peer and the relay address.
struct to_client_key {
	struct addr peer_ip;
	struct addr relay_ip;
	__be16 peer_port;
	__be16 relay_port;
};

// Peer -> client, Data indication: the permitted peer IP (any port) and the relay address.
struct data_key {
	struct addr peer_ip;
	struct addr relay_ip;
	__be16 relay_port;
	__u16 pad;
};

// What a matching datagram becomes (source and destination; for SEND the destination port
// comes from the Send indication), until when, and where its counters are. The counters live
// apart (COUNTERS[slot]) so that the daemon can refresh a route's expiry without writing
// over increments made meanwhile.
struct route {
	struct addr src_ip;
	struct addr dst_ip;
	__be16 src_port;
	__be16 dst_port;
	__u16 channel; // TO_CLIENT: the channel to write
	__u16 pad;
	__u32 slot;
	__u32 pad2;
	__u64 expires_ns;
};

// What went through one route (half): datagrams, application data bytes, the client side's
// UDP payload bytes (with the ChannelData or STUN framing), when the last was.
struct counters {
	__u64 packets;
	__u64 bytes;
	__u64 wire_bytes;
	__u64 last_ns;
};

#define SLOTS (2 * MAX_ENTRIES)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, __u32);
	__type(value, struct counters);
} COUNTERS SEC(".maps");

#define ROUTE_MAP(NAME, KEY)                                                                   \
	struct {                                                                               \
		__uint(type, BPF_MAP_TYPE_HASH);                                               \
		__uint(max_entries, MAX_ENTRIES);                                              \
		__type(key, struct KEY);                                                       \
		__type(value, struct route);                                                   \
	} NAME SEC(".maps")

ROUTE_MAP(TO_PEER, to_peer_key);
ROUTE_MAP(TO_CLIENT, to_client_key);
ROUTE_MAP(SEND, send_key);
ROUTE_MAP(DATA, data_key);

// Why datagrams were handed on, and what was relayed (per CPU): the daemon reads them for its
// metrics.
enum stat {
	STAT_TO_PEER = 0,
	STAT_TO_CLIENT,
	STAT_EXPIRED,
	STAT_UNHANDLED, // matched, but too big, not routable here, or a helper refused
	STAT_GSO,       // matched, but a GSO packet (several datagrams in one)
	STAT_PADDED,    // padded ChannelData relayed (its padding dropped)
	STAT_SEND,      // Send indications relayed
	STAT_DATA,      // Data indications written
	STAT_HAIRPIN,   // relayed client to client in one pass
	STAT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} STATS SEC(".maps");

// Keeps `v` in one register through the bounds check that follows: clang may otherwise check
// a 32-bit copy and hand a helper the 64-bit value the verifier cannot bound.
#define PIN(v) asm volatile("" : "+r"(v))

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&STATS, &which);
	if (v)
		*v += 1;
}

// What came in: the L3 family and addresses, the UDP ports and length, and where the
// application data is (prefix: bytes between the UDP header and the data; suffix: after it).
struct in {
	__u32 v6;
	__u32 l3_len;
	struct addr src;
	struct addr dst;
	__be16 sport;
	__be16 dport;
	__u32 ulen;
	__u32 prefix;
	__u32 data_len;
	__u32 suffix;
};

enum out_kind {
	OUT_RAW = 0, // the data alone (to a peer)
	OUT_CD,      // ChannelData (to a client)
	OUT_DATA,    // a Data indication (to a client)
};

// What goes out: addresses and ports, and how the data is wrapped.
struct out {
	struct addr src;
	struct addr dst;
	__be16 sport;
	__be16 dport;
	__u32 kind;
	__u16 channel;
	// OUT_DATA: the peer the data came from.
	struct addr peer;
	__be16 peer_port;
};

// Everything a datagram's handling keeps, per CPU (the program runs with bottom halves off,
// so nothing else on the CPU uses it meanwhile): the BPF stack's 512 bytes are too few.
struct scratch {
	struct in in;
	struct out o;   // the first hop
	struct out hop; // to a client of this server, from another
	struct addr peer;
	union {
		struct to_peer_key tp;
		struct send_key sk;
		struct to_client_key ck;
		struct data_key dk;
	} key;
	struct bpf_fib_lookup fib;
	__be32 ph_old[10];
	__be32 ph_new[10];
	__u8 chunk[256]; // a full checksum's pieces
	// The bytes around the data, old and new.
	__u8 before[UDP_LEN + MAX_PREFIX];
	__u8 after[UDP_LEN + MAX_PREFIX];
	__u8 wold[MAX_SUFFIX + 4];
	__u8 wnew[MAX_SUFFIX + 4];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} SCRATCH SEC(".maps");

static __always_inline int is_v4_mapped(const struct addr *a)
{
	const __u32 *w = (const __u32 *)a->b;
	return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0xffff);
}

static __always_inline void set_v4(struct addr *a, __be32 ip)
{
	__u32 *w = (__u32 *)a->b;
	w[0] = 0;
	w[1] = 0;
	w[2] = bpf_htonl(0xffff);
	w[3] = ip;
}

static __always_inline void copy_addr(struct addr *to, const struct addr *from)
{
	__builtin_memcpy(to->b, from->b, 16);
}

// A GSO packet (several datagrams in one: a same-host sender's UDP_SEGMENT batch), counted.
static __always_inline int gso(struct __sk_buff *skb)
{
	if (skb->gso_segs > 1 || skb->gso_size) {
		count(STAT_GSO);
		return 1;
	}
	return 0;
}

static __always_inline int expired(struct route *r, __u64 now)
{
	if (now >= r->expires_ns) {
		count(STAT_EXPIRED);
		return 1;
	}
	return 0;
}

static __always_inline void credit(struct route *r, __u32 len, __u32 wire, __u64 now)
{
	__u32 slot = r->slot;
	struct counters *c = bpf_map_lookup_elem(&COUNTERS, &slot);
	if (!c)
		return;
	__sync_fetch_and_add(&c->packets, 1);
	__sync_fetch_and_add(&c->bytes, len);
	__sync_fetch_and_add(&c->wire_bytes, wire);
	c->last_ns = now;
}

// The UDP payload a client gets: the data in ChannelData, or in a Data indication.
static __always_inline __u32 client_payload(__u32 kind, __u32 v6, __u32 dlen)
{
	if (kind == OUT_CD)
		return CD_LEN + dlen;
	return STUN_HDR + 4 + (v6 ? 20 : 8) + 4 + ((dlen + 3) & ~3u);
}

// Where the rewritten datagram goes: 0 = up the local stack (TC_ACT_OK), > 0 = redirected
// out of that interface (MAC addresses in `fib`), < 0 = hand it on unchanged.
static __always_inline int route_out(struct __sk_buff *skb, const struct out *o, __u32 v6,
				     __u32 l3_total, struct bpf_fib_lookup *fib)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->l4_protocol = IPPROTO_UDP;
	fib->sport = o->sport;
	fib->dport = o->dport;
	fib->tot_len = l3_total;
	fib->ifindex = skb->ingress_ifindex;
	if (v6) {
		fib->family = AF_INET6;
		__builtin_memcpy(fib->ipv6_src, o->src.b, 16);
		__builtin_memcpy(fib->ipv6_dst, o->dst.b, 16);
	} else {
		fib->family = AF_INET;
		fib->ipv4_src = ((const __u32 *)o->src.b)[3];
		fib->ipv4_dst = ((const __u32 *)o->dst.b)[3];
	}
	long rc = bpf_fib_lookup(skb, fib, sizeof(*fib), BPF_FIB_LOOKUP_OUTPUT);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return 0; // a local address: deliver here
	if (rc == BPF_FIB_LKUP_RET_SUCCESS)
		return fib->ifindex;
	return -1; // no neighbour yet, MTU, blackhole...: the daemon sends it
}

// Reads the L3 and UDP headers. 0: a UDP datagram this program may handle.
static __always_inline int parse(struct __sk_buff *skb, struct in *in)
{
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, ETH_LEN, &ip, sizeof(ip)))
			return -1;
		if (ip.ihl != 5 || ip.version != 4 || ip.protocol != IPPROTO_UDP ||
		    (ip.frag_off & bpf_htons(0x3fff)))
			return -1;
		in->v6 = 0;
		in->l3_len = IP4_LEN;
		set_v4(&in->src, ip.saddr);
		set_v4(&in->dst, ip.daddr);
		struct udphdr udp;
		if (bpf_skb_load_bytes(skb, ETH_LEN + IP4_LEN, &udp, sizeof(udp)))
			return -1;
		in->ulen = bpf_ntohs(udp.len);
		if (bpf_ntohs(ip.tot_len) != in->ulen + IP4_LEN)
			return -1;
		in->sport = udp.source;
		in->dport = udp.dest;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip;
		if (bpf_skb_load_bytes(skb, ETH_LEN, &ip, sizeof(ip)))
			return -1;
		if (ip.version != 6 || ip.nexthdr != IPPROTO_UDP)
			return -1;
		in->v6 = 1;
		in->l3_len = IP6_LEN;
		__builtin_memcpy(in->src.b, &ip.saddr, 16);
		__builtin_memcpy(in->dst.b, &ip.daddr, 16);
		struct udphdr udp;
		if (bpf_skb_load_bytes(skb, ETH_LEN + IP6_LEN, &udp, sizeof(udp)))
			return -1;
		in->ulen = bpf_ntohs(udp.len);
		if (bpf_ntohs(ip.payload_len) != in->ulen)
			return -1;
		in->sport = udp.source;
		in->dport = udp.dest;
	} else {
		return -1;
	}
	if (in->ulen < UDP_LEN || in->ulen > MAX_DGRAM)
		return -1;
	if (skb->len < ETH_LEN + in->l3_len + in->ulen)
		return -1; // not an Ethernet-framed packet (a trailer, Ethernet's padding, is cut)
	return 0;
}

// A Send indication from a client: the peer it names and where its data is. 0 if the core
// would relay it (a peer and one DATA, nothing it would refuse).
static __noinline int parse_send(struct __sk_buff *skb, struct in *in, struct addr *peer,
				      __be16 *peer_port)
{
	__u32 base = ETH_LEN + in->l3_len + UDP_LEN;
	__u8 hdr[STUN_HDR];
	if (bpf_skb_load_bytes(skb, base, hdr, STUN_HDR))
		return -1;
	__u32 len = ((__u32)hdr[2] << 8) | hdr[3];
	if (*(__be32 *)&hdr[4] != bpf_htonl(MAGIC) || (len & 3) || STUN_HDR + len + UDP_LEN != in->ulen)
		return -1;
	__u32 pos = STUN_HDR, end = STUN_HDR + len;
	int have_peer = 0, have_data = 0, fingerprint = 0;
	for (int i = 0; i < MAX_ATTRS; i++) {
		if (pos >= end)
			break;
		if (fingerprint || pos > MAX_PREFIX + MAX_DGRAM)
			return -1; // nothing may follow FINGERPRINT
		__u8 th[4];
		if (bpf_skb_load_bytes(skb, base + (pos & 0xffff), th, 4))
			return -1;
		__u16 at = ((__u16)th[0] << 8) | th[1];
		__u32 alen = ((__u32)th[2] << 8) | th[3];
		__u32 next = pos + 4 + ((alen + 3) & ~3u);
		if (next > end)
			return -1;
		if (at == ATTR_XOR_PEER) {
			if (have_peer)
				return -1; // the core takes the first: let it
			__u8 v[20];
			if (alen == 8) {
				if (bpf_skb_load_bytes(skb, base + ((pos + 4) & 0xffff), v, 8) || v[1] != 1)
					return -1;
				__be32 ip = *(__be32 *)&v[4] ^ bpf_htonl(MAGIC);
				set_v4(peer, ip);
			} else if (alen == 20) {
				if (bpf_skb_load_bytes(skb, base + ((pos + 4) & 0xffff), v, 20) || v[1] != 2)
					return -1;
				__u32 *w = (__u32 *)peer->b;
				w[0] = *(__u32 *)&v[4] ^ bpf_htonl(MAGIC);
				w[1] = *(__u32 *)&v[8] ^ *(__u32 *)&hdr[8];
				w[2] = *(__u32 *)&v[12] ^ *(__u32 *)&hdr[12];
				w[3] = *(__u32 *)&v[16] ^ *(__u32 *)&hdr[16];
			} else {
				return -1;
			}
			*peer_port = *(__be16 *)&v[2] ^ bpf_htons(MAGIC >> 16);
			have_peer = 1;
		} else if (at == ATTR_DATA) {
			if (have_data)
				return -1;
			in->prefix = (pos & 0xffff) + 4;
			in->data_len = alen;
			have_data = 1;
		} else if (at == ATTR_FINGERPRINT) {
			fingerprint = 1;
		} else if (at < 0x8000 && at != ATTR_DONT_FRAGMENT) {
			return -1; // comprehension-required: the core refuses what it does not know
		}
		pos = next;
	}
	if (pos != end || !have_peer || !have_data)
		return -1;
	if (in->prefix > MAX_PREFIX)
		return -1;
	in->suffix = in->ulen - UDP_LEN - in->prefix - in->data_len;
	if (in->suffix > MAX_SUFFIX)
		return -1;
	return 0;
}

// The 16-bit one's complement of a 32-bit sum, as a checksum field holds it (network order).
static __always_inline __u16 fold(__s64 sum)
{
	__u32 s = (__u32)sum;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

// Writes the UDP datagram's full checksum (`ulen` bytes at `l4`, the pseudo header in
// sc->ph_new), for a packet the stack will verify.
__noinline int full_checksum(struct __sk_buff *skb, struct scratch *sc, __u32 l4, __u32 ulen,
			     __u32 ph_len)
{
	if (!sc)
		return -1;
	__u16 z = 0;
	if (bpf_skb_store_bytes(skb, l4 + 6, &z, 2, 0))
		return -1;
	if (ph_len != 12 && ph_len != 40)
		return -1;
	__s64 sum = bpf_csum_diff(NULL, 0, sc->ph_new, ph_len, 0);
	if (sum < 0 || ulen > MAX_DGRAM)
		return -1;
	__u32 off = 0;
	for (int i = 0; i < MAX_DGRAM / 256; i++) {
		__u32 left = ulen - off;
		if (left < 4)
			break;
		__u32 sz = left >= 256 ? 256 : (left & ~3u);
		PIN(sz);
		if (sz < 4 || sz > 256)
			return -1;
		if (bpf_skb_load_bytes(skb, (l4 + off) & 0xffff, sc->chunk, sz))
			return -1;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)sc->chunk, sz, (__wsum)sum);
		if (sum < 0)
			return -1;
		off += sz;
	}
	__u32 rest = ulen - off;
	if (rest > 0 && rest < 4) {
		__u32 word = 0;
		if (bpf_skb_load_bytes(skb, (l4 + off) & 0xffff, &word, rest & 3))
			return -1;
		sum = bpf_csum_diff(NULL, 0, &word, 4, (__wsum)sum);
		if (sum < 0)
			return -1;
	}
	__u16 c = ~fold(sum);
	if (c == 0)
		c = 0xffff;
	return bpf_skb_store_bytes(skb, l4 + 6, &c, 2, 0) ? -1 : 0;
}

// Rewrites the datagram described by `in` into the one `o` describes and sends it on.
static __noinline int rewrite(struct __sk_buff *skb, struct scratch *sc, struct out *o)
{
	struct in *in = &sc->in;
	__u32 l4 = ETH_LEN + in->l3_len;
	__u32 dlen = in->data_len;
	__u32 oprefix = 0, opad = 0;
	if (o->kind == OUT_CD) {
		oprefix = CD_LEN;
	} else if (o->kind == OUT_DATA) {
		// Header, XOR-PEER-ADDRESS (v4: 8, v6: 20 bytes of value), DATA's header; then the
		// data and its padding (client_payload).
		oprefix = STUN_HDR + 4 + (in->v6 ? 20 : 8) + 4;
		opad = (4 - (dlen & 3)) & 3;
	}
	__u32 oulen = UDP_LEN + oprefix + dlen + opad;
	if (oulen > MAX_DGRAM || in->prefix > MAX_PREFIX || in->suffix > MAX_SUFFIX ||
	    (in->prefix & 3)) {
		count(STAT_UNHANDLED);
		return TC_ACT_UNSPEC;
	}
	struct bpf_fib_lookup *fib = &sc->fib;
	int dev = route_out(skb, o, in->v6, oulen + in->l3_len, fib);
	if (dev < 0) {
		count(STAT_UNHANDLED);
		return TC_ACT_UNSPEC;
	}

	__u8 *before = sc->before, *after = sc->after, *wold = sc->wold, *wnew = sc->wnew;
	__builtin_memset(sc->after, 0, sizeof(sc->after));
	__builtin_memset(sc->wnew, 0, sizeof(sc->wnew));
	// The bytes before the data, old (UDP header and prefix) and new, checksum field zero.
	__u32 olen = UDP_LEN + in->prefix;
	PIN(olen);
	if (olen < UDP_LEN || olen > sizeof(sc->before))
		return TC_ACT_UNSPEC;
	if (bpf_skb_load_bytes(skb, l4, before, olen))
		return TC_ACT_UNSPEC;
	__be16 check = *(__be16 *)&before[6];
	*(__be16 *)&before[6] = 0;
	*(__be16 *)&after[0] = o->sport;
	*(__be16 *)&after[2] = o->dport;
	*(__be16 *)&after[4] = bpf_htons(oulen);
	if (o->kind == OUT_CD) {
		after[8] = o->channel >> 8;
		after[9] = o->channel & 0xff;
		after[10] = dlen >> 8;
		after[11] = dlen & 0xff;
	} else if (o->kind == OUT_DATA) {
		__u32 slen = oulen - UDP_LEN - STUN_HDR;
		after[8] = DATA_INDICATION >> 8;
		after[9] = DATA_INDICATION & 0xff;
		after[10] = slen >> 8;
		after[11] = slen & 0xff;
		*(__be32 *)&after[12] = bpf_htonl(MAGIC);
		__u32 t0 = bpf_get_prandom_u32(), t1 = bpf_get_prandom_u32(), t2 = bpf_get_prandom_u32();
		*(__u32 *)&after[16] = t0;
		*(__u32 *)&after[20] = t1;
		*(__u32 *)&after[24] = t2;
		after[28] = ATTR_XOR_PEER >> 8;
		after[29] = ATTR_XOR_PEER & 0xff;
		after[30] = 0;
		after[31] = in->v6 ? 20 : 8;
		after[32] = 0;
		after[33] = in->v6 ? 2 : 1;
		*(__be16 *)&after[34] = o->peer_port ^ bpf_htons(MAGIC >> 16);
		const __u32 *p = (const __u32 *)o->peer.b;
		if (in->v6) {
			*(__u32 *)&after[36] = p[0] ^ bpf_htonl(MAGIC);
			*(__u32 *)&after[40] = p[1] ^ t0;
			*(__u32 *)&after[44] = p[2] ^ t1;
			*(__u32 *)&after[48] = p[3] ^ t2;
			after[52] = ATTR_DATA >> 8;
			after[53] = ATTR_DATA & 0xff;
			after[54] = dlen >> 8;
			after[55] = dlen & 0xff;
		} else {
			*(__u32 *)&after[36] = p[3] ^ bpf_htonl(MAGIC);
			after[40] = ATTR_DATA >> 8;
			after[41] = ATTR_DATA & 0xff;
			after[42] = dlen >> 8;
			after[43] = dlen & 0xff;
		}
	}
	__u32 nlen = UDP_LEN + oprefix;
	PIN(nlen);
	if (nlen < UDP_LEN || nlen > sizeof(sc->after))
		return TC_ACT_UNSPEC;

	// The 4-byte words from the data's last one to the end: old, and without what follows
	// the data (the new datagram ends there, its padding zero).
	__u32 dend = UDP_LEN + in->prefix + dlen; // from the UDP header
	__u32 wstart = dend & ~3u;
	__u32 wlen = in->ulen - wstart;
	PIN(wlen);
	__s64 sum = 0;
	if (in->suffix > 0) {
		if (wlen < 4 || wlen > sizeof(sc->wold) || (wlen & 3))
			return TC_ACT_UNSPEC;
		if (bpf_skb_load_bytes(skb, l4 + (wstart & 0xffff), wold, wlen))
			return TC_ACT_UNSPEC;
		__u32 keep = dend - wstart; // 0..3 data bytes in the first word
#pragma unroll
		for (int i = 0; i < 3; i++)
			if (i < keep)
				wnew[i] = wold[i];
		sum = bpf_csum_diff((__be32 *)wold, wlen, (__be32 *)wnew, wlen, 0);
		if (sum < 0)
			return TC_ACT_UNSPEC;
	}
	sum = bpf_csum_diff((__be32 *)before, olen, (__be32 *)after, nlen, (__wsum)sum);
	if (sum < 0)
		return TC_ACT_UNSPEC;
	__wsum data_diff = (__wsum)sum;

	// The pseudo header: addresses, protocol and UDP length.
	__be32 *ph_old = sc->ph_old, *ph_new = sc->ph_new;
	__builtin_memset(sc->ph_old, 0, sizeof(sc->ph_old));
	__builtin_memset(sc->ph_new, 0, sizeof(sc->ph_new));
	__u32 ph_len;
	if (in->v6) {
		__builtin_memcpy(&ph_old[0], in->src.b, 16);
		__builtin_memcpy(&ph_old[4], in->dst.b, 16);
		ph_old[8] = bpf_htonl(in->ulen);
		ph_old[9] = bpf_htonl(IPPROTO_UDP);
		__builtin_memcpy(&ph_new[0], o->src.b, 16);
		__builtin_memcpy(&ph_new[4], o->dst.b, 16);
		ph_new[8] = bpf_htonl(oulen);
		ph_new[9] = bpf_htonl(IPPROTO_UDP);
		ph_len = 40;
	} else {
		ph_old[0] = ((const __u32 *)in->src.b)[3];
		ph_old[1] = ((const __u32 *)in->dst.b)[3];
		ph_old[2] = bpf_htonl((IPPROTO_UDP << 16) | in->ulen);
		ph_new[0] = ((const __u32 *)o->src.b)[3];
		ph_new[1] = ((const __u32 *)o->dst.b)[3];
		ph_new[2] = bpf_htonl((IPPROTO_UDP << 16) | oulen);
		ph_len = 12;
	}
	sum = bpf_csum_diff(ph_old, ph_len, ph_new, ph_len, 0);
	if (sum < 0)
		return TC_ACT_UNSPEC;
	__wsum pseudo_diff = (__wsum)sum;

	// A local sender's packet (CHECKSUM_PARTIAL: its field holds the pseudo header's sum,
	// the rest is left to the device) looks like this; a full checksum does only by chance,
	// and then what follows is right anyway. Its checksum start no longer points at the UDP
	// header once bytes are added or removed, and the receiving stack may then verify it:
	// write it a full checksum (right whether or not it is verified). Out of another device
	// it would be finished at the old offset: leave it to the daemon.
	int partial = 0;
	if (check) {
		sum = bpf_csum_diff(NULL, 0, ph_old, ph_len, 0);
		if (sum < 0)
			return TC_ACT_UNSPEC;
		partial = fold(sum) == check;
	}
	int delta = (int)oprefix - (int)in->prefix;
	if (partial && dev > 0) {
		count(STAT_UNHANDLED);
		return TC_ACT_UNSPEC;
	}
	int full = partial;

	// From here on the packet changes: a failure drops it (it cannot be handed on).
	if (delta != 0 && bpf_skb_adjust_room(skb, delta, BPF_ADJ_ROOM_NET, 0))
		return TC_ACT_SHOT;
	__u32 total = l4 + oulen;
	if (skb->len != total && bpf_skb_change_tail(skb, total, 0))
		return TC_ACT_SHOT;
	if (opad) {
		__u32 zero = 0;
		if (bpf_skb_store_bytes(skb, (total - opad) & 0xffff, &zero, opad & 3, 0))
			return TC_ACT_SHOT;
	}
	*(__be16 *)&after[6] = check;
	if (bpf_skb_store_bytes(skb, l4, after, nlen, 0))
		return TC_ACT_SHOT;
	__u64 f = BPF_F_MARK_MANGLED_0;
	if (full) {
		if (full_checksum(skb, sc, l4, oulen, ph_len))
			return TC_ACT_SHOT;
	} else if (bpf_l4_csum_replace(skb, l4 + 6, 0, data_diff, f) ||
		   bpf_l4_csum_replace(skb, l4 + 6, 0, pseudo_diff, f | BPF_F_PSEUDO_HDR)) {
		return TC_ACT_SHOT;
	}
	if (in->v6) {
		__be16 plen = bpf_htons(oulen);
		if (bpf_skb_store_bytes(skb, ETH_LEN + 4, &plen, 2, 0) ||
		    bpf_skb_store_bytes(skb, ETH_LEN + 8, o->src.b, 16, 0) ||
		    bpf_skb_store_bytes(skb, ETH_LEN + 24, o->dst.b, 16, 0))
			return TC_ACT_SHOT;
	} else {
		__be16 old_tot = bpf_htons(in->ulen + IP4_LEN), new_tot = bpf_htons(oulen + IP4_LEN);
		__be32 os = ph_old[0], od = ph_old[1], ns = ph_new[0], nd = ph_new[1];
		if (bpf_l3_csum_replace(skb, ETH_LEN + 10, os, ns, 4) ||
		    bpf_l3_csum_replace(skb, ETH_LEN + 10, od, nd, 4) ||
		    bpf_l3_csum_replace(skb, ETH_LEN + 10, old_tot, new_tot, 2) ||
		    bpf_skb_store_bytes(skb, ETH_LEN + 2, &new_tot, 2, 0) ||
		    bpf_skb_store_bytes(skb, ETH_LEN + 12, &ns, 4, 0) ||
		    bpf_skb_store_bytes(skb, ETH_LEN + 16, &nd, 4, 0))
			return TC_ACT_SHOT;
	}
	if (dev == 0)
		return TC_ACT_OK;
	if (bpf_skb_store_bytes(skb, 0, fib->dmac, 6, 0) || bpf_skb_store_bytes(skb, 6, fib->smac, 6, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(dev, 0);
}

// To a client: ChannelData if a channel is bound to the peer `from`:`port`, else a Data
// indication if its IP has a permission. The route (`o` set from it), or NULL.
static __always_inline struct route *towards_client(struct scratch *sc, const struct addr *from,
						    __be16 port, const struct addr *relay,
						    __be16 relay_port, __u64 now, struct out *o)
{
	struct to_client_key *ck = &sc->key.ck;
	__builtin_memset(&sc->key, 0, sizeof(sc->key));
	ck->peer_port = port;
	ck->relay_port = relay_port;
	copy_addr(&ck->peer_ip, from);
	copy_addr(&ck->relay_ip, relay);
	struct route *r = bpf_map_lookup_elem(&TO_CLIENT, ck);
	if (r) {
		if (expired(r, now))
			return NULL;
		o->kind = OUT_CD;
		o->channel = r->channel;
	} else {
		struct data_key *dk = &sc->key.dk;
		__builtin_memset(&sc->key, 0, sizeof(sc->key));
		dk->relay_port = relay_port;
		copy_addr(&dk->peer_ip, from);
		copy_addr(&dk->relay_ip, relay);
		r = bpf_map_lookup_elem(&DATA, dk);
		if (!r || expired(r, now))
			return NULL;
		o->kind = OUT_DATA;
		copy_addr(&o->peer, from);
		o->peer_port = port;
	}
	copy_addr(&o->src, &r->src_ip);
	copy_addr(&o->dst, &r->dst_ip);
	o->sport = r->src_port;
	o->dport = r->dst_port;
	return r;
}

static __always_inline int relayed(int rc)
{
	return rc == TC_ACT_OK || rc == TC_ACT_REDIRECT;
}

// Sends the datagram on to a client (through `r`).
static __always_inline int to_client(struct __sk_buff *skb, struct scratch *sc, struct out *o,
				     struct route *r, __u64 now)
{
	struct in *in = &sc->in;
	int rc = rewrite(skb, sc, o);
	if (relayed(rc)) {
		credit(r, in->data_len, client_payload(o->kind, in->v6, in->data_len), now);
		count(STAT_TO_CLIENT);
		if (o->kind == OUT_DATA)
			count(STAT_DATA);
	}
	return rc;
}

// A client's data to a peer (`r`: its route, `peer_port`: for a Send indication), or, when
// the peer is another allocation's relay here, straight to that allocation's client.
static __always_inline int from_client(struct __sk_buff *skb, struct scratch *sc, struct route *r,
				       __be16 peer_port, __u64 now)
{
	struct in *in = &sc->in;
	struct out *o = &sc->o;
	__builtin_memset(o, 0, sizeof(*o));
	o->kind = OUT_RAW;
	o->sport = r->src_port;
	o->dport = peer_port;
	copy_addr(&o->src, &r->src_ip);
	copy_addr(&o->dst, &r->dst_ip);
	struct out *hop = &sc->hop;
	__builtin_memset(hop, 0, sizeof(*hop));
	struct route *other = towards_client(sc, &o->src, o->sport, &o->dst, o->dport, now, hop);
	int rc = other ? to_client(skb, sc, hop, other, now) : rewrite(skb, sc, o);
	if (relayed(rc)) {
		credit(r, in->data_len, in->ulen - UDP_LEN, now);
		count(STAT_TO_PEER);
		if (other)
			count(STAT_HAIRPIN);
	}
	return rc;
}

// Client ChannelData on a bound channel.
static __always_inline int channel_data(struct __sk_buff *skb, struct scratch *sc, __u64 now)
{
	struct in *in = &sc->in;
	__u8 h[CD_LEN];
	if (bpf_skb_load_bytes(skb, ETH_LEN + in->l3_len + UDP_LEN, h, CD_LEN))
		return -1;
	__u16 channel = ((__u16)h[0] << 8) | h[1];
	__u32 len = ((__u32)h[2] << 8) | h[3];
	if (channel < 0x4000 || channel > 0x7fff)
		return -1;
	struct to_peer_key *key = &sc->key.tp;
	__builtin_memset(&sc->key, 0, sizeof(sc->key));
	key->client_port = in->sport;
	key->server_port = in->dport;
	key->channel = channel;
	copy_addr(&key->client_ip, &in->src);
	copy_addr(&key->server_ip, &in->dst);
	struct route *r = bpf_map_lookup_elem(&TO_PEER, key);
	if (!r)
		return -1;
	if (expired(r, now))
		return TC_ACT_UNSPEC;
	if (gso(skb))
		return TC_ACT_UNSPEC;
	// Over UDP the message may be padded to 4 bytes (the core allows it); nothing else.
	__u32 avail = in->ulen - UDP_LEN - CD_LEN;
	if (len > avail || avail > ((len + 3) & ~3u)) {
		count(STAT_UNHANDLED);
		return TC_ACT_UNSPEC;
	}
	in->prefix = CD_LEN;
	in->data_len = len;
	in->suffix = avail - len;
	if (in->suffix)
		count(STAT_PADDED);
	return from_client(skb, sc, r, r->dst_port, now);
}

// A client's Send indication to a permitted peer.
static __always_inline int send_indication(struct __sk_buff *skb, struct scratch *sc, __u64 now)
{
	struct in *in = &sc->in;
	struct addr *peer = &sc->peer;
	__be16 peer_port = 0;
	__builtin_memset(peer, 0, sizeof(*peer));
	// A GSO batch: its first datagram says whether it belongs to a route.
	__u32 whole = in->ulen;
	if (skb->gso_size && skb->gso_size + UDP_LEN < whole)
		in->ulen = skb->gso_size + UDP_LEN;
	int bad = parse_send(skb, in, peer, &peer_port);
	in->ulen = whole;
	if (bad)
		return -1;
	if (is_v4_mapped(peer) != !in->v6)
		return -1;
	struct send_key *key = &sc->key.sk;
	__builtin_memset(&sc->key, 0, sizeof(sc->key));
	key->client_port = in->sport;
	key->server_port = in->dport;
	copy_addr(&key->client_ip, &in->src);
	copy_addr(&key->server_ip, &in->dst);
	copy_addr(&key->peer_ip, peer);
	struct route *r = bpf_map_lookup_elem(&SEND, key);
	if (!r)
		return -1;
	if (expired(r, now) || gso(skb))
		return TC_ACT_UNSPEC;
	int rc = from_client(skb, sc, r, peer_port, now);
	if (rc == TC_ACT_OK || rc == TC_ACT_REDIRECT)
		count(STAT_SEND);
	return rc;
}

SEC("classifier")
int lastcall_turn_ingress(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct scratch *sc = bpf_map_lookup_elem(&SCRATCH, &zero);
	if (!sc)
		return TC_ACT_UNSPEC;
	struct in *in = &sc->in;
	__builtin_memset(in, 0, sizeof(*in));
	if (parse(skb, in))
		return TC_ACT_UNSPEC;
	__u64 now = bpf_ktime_get_ns();
	__u32 ulen = in->ulen;
	if (ulen >= UDP_LEN + CD_LEN) {
		__u8 first[2];
		if (bpf_skb_load_bytes(skb, ETH_LEN + in->l3_len + UDP_LEN, first, 2))
			return TC_ACT_UNSPEC;
		int rc = -1;
		if (first[0] >> 6 == 1)
			rc = channel_data(skb, sc, now);
		else if (first[0] == 0 && first[1] == SEND_INDICATION && ulen >= UDP_LEN + STUN_HDR)
			rc = send_indication(skb, sc, now);
		if (rc >= 0)
			return rc;
	}
	// A peer's datagram to a relay address.
	struct out *o = &sc->o;
	__builtin_memset(o, 0, sizeof(*o));
	struct route *r = towards_client(sc, &in->src, in->sport, &in->dst, in->dport, now, o);
	if (!r || gso(skb))
		return TC_ACT_UNSPEC;
	in->prefix = 0;
	in->data_len = ulen - UDP_LEN;
	in->suffix = 0;
	return to_client(skb, sc, o, r, now);
}

// The kernel wants a GPL-compatible licence for bpf_fib_lookup and friends; the file is
// GPL-2.0 OR Apache-2.0 (SPDX line above).
char LICENSE[] SEC("license") = "GPL";
