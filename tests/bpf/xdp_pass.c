/* Passes every frame. The load-balancing testbed attaches it to the router's end of the
 * balancer's link: a veth takes frames sent back by XDP (XDP_TX, redirects) only when its peer
 * runs an XDP program, as a NIC driver takes them by itself. Built and attached like
 * ipip_decap.c. */
#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
