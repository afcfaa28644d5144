/* Sends every frame back out of the interface it came in on, unchanged: the wire benchmark's
 * floor for a forwarder (pirate_lb, Katran's balancer), which does the same after its lookup and
 * encapsulation. */
#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))

SEC("xdp")
int xdp_tx(struct xdp_md *ctx)
{
	return XDP_TX;
}

char _license[] SEC("license") = "GPL";
