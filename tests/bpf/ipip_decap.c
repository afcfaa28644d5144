/* The load-balancing testbed's stand-in for Linux's ipip module (CONFIG_NET_IPIP is not set on
 * the machines this suite runs on): an XDP program on each backend's interface that strips the
 * outer IPv4 header of an IPIP packet, so the inner packet to the VIP is delivered locally, as
 * a real behind a DSR balancer decapsulates it. Everything else passes untouched. Built by
 * pirate-tests (balancing.rs) with clang, attached with `ip link set ... xdpdrv obj`. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>

#define SEC(name) __attribute__((section(name), used))

static long (*bpf_xdp_adjust_head)(void *ctx, int delta) = (void *)44;

SEC("xdp")
int ipip_decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *outer = (void *)(eth + 1);

	if ((void *)(outer + 1) > end || eth->h_proto != __builtin_bswap16(ETH_P_IP))
		return XDP_PASS;
	if (outer->protocol != 4 /* IPIP */ || outer->ihl != 5)
		return XDP_PASS;
	struct ethhdr copy = *eth;
	if (bpf_xdp_adjust_head(ctx, (int)sizeof(struct iphdr)))
		return XDP_PASS;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	*eth = copy;
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
