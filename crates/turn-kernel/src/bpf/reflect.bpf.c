// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// The machine's own reference for the TURN benchmark: a tc ingress program that sends every
// IPv4 UDP datagram to one port straight back to where it came from (source and destination
// addresses and ports swapped; the checksums, sums of the same words, do not change). A round
// trip through it costs only the sender's side and the kernel's delivery: the least a
// datagram's echo can cost on this machine. `lastcall_drop`, the same match, drops them
// instead: what the load generator offers when nothing comes back.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

// The port reflected (network order), set by the loader.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} PORT SEC(".maps");

// The datagram's IPv4 and UDP headers if it is an IPv4 UDP datagram to PORT, else NULL.
static __always_inline struct iphdr *to_port(struct __sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return NULL;
	__u32 k = 0;
	__u32 *port = bpf_map_lookup_elem(&PORT, &k);
	if (!port)
		return NULL;
	if (bpf_skb_pull_data(skb, sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr)))
		return NULL;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end)
		return NULL;
	if (ip->ihl != 5 || ip->protocol != IPPROTO_UDP || udp->dest != (__be16)*port)
		return NULL;
	return ip;
}

SEC("classifier")
int lastcall_reflect(struct __sk_buff *skb)
{
	struct iphdr *ip = to_port(skb);
	if (!ip)
		return TC_ACT_UNSPEC;
	struct udphdr *udp = (void *)(ip + 1);
	__be32 a = ip->saddr;
	ip->saddr = ip->daddr;
	ip->daddr = a;
	__be16 p = udp->source;
	udp->source = udp->dest;
	udp->dest = p;
	return TC_ACT_OK;
}

// The generator's reference with nothing coming back: every datagram to PORT is dropped at
// tc ingress, the cheapest end a datagram on loopback can have (no socket, no reply).
SEC("classifier")
int lastcall_drop(struct __sk_buff *skb)
{
	return to_port(skb) ? TC_ACT_SHOT : TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "GPL";
