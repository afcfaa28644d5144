//! The load-balancing testbed (DESIGN.md §5), laid out as Katran is deployed: the balancer
//! hangs off a router on one interface ("one-armed"); the router sends it the VIP's traffic,
//! the balancer sends each packet back IPIP-encapsulated to a real, and the reals answer the
//! client straight through the router. pirated runs in `lb` on [`LB_IF`] and sees client→VIP
//! packets only.
//!
//! ```text
//!  client c-r 10.204.1.1 ── 10.204.1.2 r-c [router] r-lb 10.204.2.1 ── 10.204.2.2 lb-r [lb]
//!                                                 r-bN 10.204.1N.1 ── 10.204.1N.2 b-r [backend N]
//! ```
//! Every backend holds the VIP on its loopback and runs `bpf/ipip_decap.c` on `b-r`, an XDP
//! program standing in for Linux's ipip module (not built into this kernel). The links towards
//! the backends carry 1600-byte frames, so an encapsulated full-size packet fits; the router's
//! end of the balancer's link runs `bpf/xdp_pass.c`, without which a veth drops what its peer
//! sends back from XDP.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result};

use crate::{
    katran::{build_balancer, Katran},
    netns::{require_root, veth, Netns},
    testbed::{metric, wait_until, Pirated},
};

pub const CLIENT_IP: &str = "10.204.1.1";
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 204, 100, 1);
pub const VIP_PORT: u16 = 80;
/// pirated's interface in `lb`, and its address there (the tunnel's outer source).
pub const LB_IF: &str = "lb-r";
pub const LB_IP: Ipv4Addr = Ipv4Addr::new(10, 204, 2, 2);

/// Backend `i`'s address (its real).
pub fn backend_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 204, 10 + i as u8, 2)
}

pub fn vip() -> SocketAddr {
    SocketAddr::from((VIP, VIP_PORT))
}

pub struct Balanced {
    pub client: Netns,
    pub router: Netns,
    pub lb: Netns,
    pub backends: Vec<Netns>,
}

impl Balanced {
    /// The testbed with `n` backends (at most 80); its XDP programs are built into `build_dir`.
    pub fn new(n: usize, build_dir: &Path) -> Result<Balanced> {
        require_root()?;
        let decap = build_xdp(build_dir, "ipip_decap")?;
        let pass = build_xdp(build_dir, "xdp_pass")?;
        let client = Netns::new("cli")?;
        let router = Netns::new("rtr")?;
        let lb = Netns::new("lb")?;
        let backends = (0..n).map(|i| Netns::new(&format!("b{i}"))).collect::<Result<Vec<_>>>()?;
        veth(&client, "c-r", &router, "r-c")?;
        veth(&router, "r-lb", &lb, LB_IF)?;
        for (i, b) in backends.iter().enumerate() {
            veth(&router, &format!("r-b{i}"), b, "b-r")?;
        }
        for ns in [&client, &router, &lb].into_iter().chain(&backends) {
            ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
            ns.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
        }
        let mut links: Vec<(&Netns, String, String, u32)> = vec![
            (&client, "c-r".into(), "10.204.1.1/24".into(), 1500),
            (&router, "r-c".into(), "10.204.1.2/24".into(), 1500),
            (&router, "r-lb".into(), "10.204.2.1/24".into(), 1600),
            (&lb, LB_IF.into(), format!("{LB_IP}/24"), 1600),
        ];
        for (i, b) in backends.iter().enumerate() {
            links.push((&router, format!("r-b{i}"), format!("10.204.{}.1/24", 10 + i), 1600));
            links.push((b, "b-r".into(), format!("{}/24", backend_ip(i)), 1600));
        }
        for (ns, ifname, cidr, mtu) in &links {
            ns.sysctl(&format!("net.ipv4.conf.{ifname}.rp_filter"), "0")?;
            // Real wires carry MTU-sized frames, not TSO/GRO super-frames (DESIGN.md §6).
            ns.offloads_off(ifname)?;
            ns.ip(&["link", "set", "dev", ifname, "mtu", &mtu.to_string()])?;
            ns.addr(ifname, cidr)?;
        }
        attach_xdp(&router, "r-lb", &pass)?;
        router.sysctl("net.ipv4.ip_forward", "1")?;
        router.route(&format!("{VIP}/32"), &LB_IP.to_string())?;
        client.route("default", "10.204.1.2")?;
        lb.route("default", "10.204.2.1")?;
        // The kernel's fallback route for encapsulated packets leaves by the interface they came
        // in on: no redirects for that.
        lb.sysctl("net.ipv4.ip_forward", "1")?;
        lb.sysctl("net.ipv4.conf.all.send_redirects", "0")?;
        lb.sysctl(&format!("net.ipv4.conf.{LB_IF}.send_redirects"), "0")?;
        for (i, b) in backends.iter().enumerate() {
            b.addr("lo", &format!("{VIP}/32"))?;
            b.route("default", &format!("10.204.{}.1", 10 + i))?;
            attach_xdp(b, "b-r", &decap)?;
        }
        Ok(Balanced { client, router, lb, backends })
    }
}

impl Balanced {
    /// pirated on [`LB_IF`] with `config`, once it has balanced an epoch: its VIPs, reals and
    /// rings are in place then (they are written after it attaches).
    pub fn pirated(&self, config: &str) -> Result<Pirated> {
        let pirated = Pirated::start(&self.lb, LB_IF, config)?;
        pirated.wait_for(Duration::from_secs(10), |v| v["type"] == "real")?;
        Ok(pirated)
    }

    /// The connections each backend has accepted (its kernel's count): the truth the forwarder's
    /// spread is held to.
    pub fn passive_opens(&self) -> Result<Vec<u64>> {
        self.backends.iter().map(|b| b.tcp_passive_opens()).collect()
    }

    /// Connections each backend accepted since [`Balanced::passive_opens`] returned `before`.
    pub fn opened_since(&self, before: &[u64]) -> Result<Vec<u64>> {
        Ok(self.passive_opens()?.iter().zip(before).map(|(a, b)| a - b).collect())
    }
}

impl Balanced {
    /// Katran's balancer, built from its sources into `build_dir` and loaded, sending what it
    /// encapsulates back out to the router (XDP_TX, to its default router's MAC).
    pub fn katran(&self, build_dir: &Path) -> Result<Arc<Katran>> {
        let katran = Katran::load(&build_balancer(build_dir)?)?;
        katran.set_default_router_mac(self.router.mac_octets("r-lb")?)?;
        Ok(Arc::new(katran))
    }

    /// pirated driving `katran` (configuration `head`, then `[lb]` with forwarder "katran" and
    /// `extra` lines), once it has found Katran in its `FORWARD`, where Katran is registered at
    /// its default position as it registers itself.
    pub fn pirated_with_katran(&self, katran: &Katran, head: &str, extra: &str) -> Result<Pirated> {
        let extra = format!("forwarder = \"katran\"\n{extra}");
        let pirated = self.pirated(&format!("{head}{}", lb_config(self.backends.len(), &extra)))?;
        katran.register(&self.forward(&pirated), 2)?;
        wait_until(Duration::from_secs(10), "pirated did not find Katran in its FORWARD", || {
            Ok(metric(&pirated.metrics(&self.lb)?, "pirated_lb_forwarder_up") == 1.0)
        })?;
        Ok(pirated)
    }

    /// `pirated`'s `FORWARD` (see [`Pirated::forward`]).
    pub fn forward(&self, pirated: &Pirated) -> PathBuf {
        pirated.forward(&self.lb)
    }
}

/// pirated's `[lb]` section for the testbed: the VIP, every backend a real, `extra` lines after.
pub fn lb_config(backends: usize, extra: &str) -> String {
    let reals: Vec<String> = (0..backends).map(|i| format!("\"{}\"", backend_ip(i))).collect();
    format!(
        "[lb]\nvips = [{{ address = \"{VIP}:{VIP_PORT}\", proto = \"tcp\", reals = [{}] }}]\ntunnel_source = \"{LB_IP}\"\n{extra}",
        reals.join(", ")
    )
}

/// Attaches `object`'s `xdp` section to `ifname` in native (driver) mode.
pub fn attach_xdp(ns: &Netns, ifname: &str, object: &Path) -> Result<()> {
    ns.ip(&["link", "set", "dev", ifname, "xdpdrv", "obj", object.to_str().context("path")?, "sec", "xdp"]).map(drop)
}

/// Compiles this crate's `bpf/<name>.c` into `out_dir/<name>.o` (clang, as Katran's balancer is
/// built).
pub fn build_xdp(out_dir: &Path, name: &str) -> Result<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("bpf/{name}.c"));
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let object = out_dir.join(format!("{name}.o"));
    let mut cmd = crate::katran::clang_bpf();
    cmd.arg("-c").arg(&source).arg("-o").arg(&object);
    crate::katran::run(&mut cmd, &format!("compiling {}", source.display()))?;
    Ok(object)
}
