/* Drops every frame. The wire benchmark attaches it to the generator's end of the link, where
 * the forwarders send their packets back (XDP_TX): a veth takes them only when its peer runs an
 * XDP program, and dropped there they cost the generator's CPU least. */
#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))

SEC("xdp")
int xdp_drop(struct xdp_md *ctx)
{
	return XDP_DROP;
}

char _license[] SEC("license") = "GPL";
