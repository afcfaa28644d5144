//! The interface the references leave by, and its transmit counters as the kernel keeps them
//! (`/sys/class/net/<interface>/statistics`, read in place each poll: a few µs), which the
//! 1-in-n and adaptive schemes read.

use std::{
    ffi::CStr,
    fs::File,
    net::{IpAddr, UdpSocket},
    os::unix::fs::FileExt,
};

use anyhow::{bail, Context};

use super::inject::Link;

/// The egress interface's transmit counters.
pub struct Egress {
    pub interface: String,
    packets: File,
    bytes: File,
}

impl Egress {
    /// The counters of the interface `socket` (connected) sends from: the one holding its
    /// source address.
    pub fn of(socket: &UdpSocket) -> anyhow::Result<Egress> {
        let source = socket.local_addr().context("the references' source address")?.ip();
        let interface = interface_of(source)?;
        let open = |name: &str| {
            let path = format!("/sys/class/net/{interface}/statistics/{name}");
            File::open(&path).with_context(|| {
                format!("opening {path}: rli.injection reads the egress interface's counters there (sysfs of this network namespace)")
            })
        };
        Ok(Egress { packets: open("tx_packets")?, bytes: open("tx_bytes")?, interface })
    }

    /// The counters now.
    pub fn read(&self) -> anyhow::Result<Link> {
        Ok(Link { packets: read_u64(&self.packets)?, bytes: read_u64(&self.bytes)? })
    }
}

fn read_u64(file: &File) -> anyhow::Result<u64> {
    let mut buf = [0u8; 24];
    let n = file.read_at(&mut buf, 0).context("reading an interface counter")?;
    let text = std::str::from_utf8(&buf[..n]).context("an interface counter")?;
    text.trim().parse().with_context(|| format!("an interface counter: {text:?}"))
}

/// The name of the interface that holds address `ip`.
fn interface_of(ip: IpAddr) -> anyhow::Result<String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(std::io::Error::last_os_error()).context("listing the interfaces' addresses");
    }
    let mut found = None;
    let mut at = list;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs made; addresses of their family's size.
        let (name, addr) = unsafe {
            let node = &*at;
            at = node.ifa_next;
            (node.ifa_name, node.ifa_addr)
        };
        if addr.is_null() {
            continue;
        }
        // SAFETY: as above.
        let this = unsafe {
            match (*addr).sa_family as i32 {
                libc::AF_INET => {
                    let a = &*(addr as *const libc::sockaddr_in);
                    Some(IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes()))
                }
                libc::AF_INET6 => Some(IpAddr::from((*(addr as *const libc::sockaddr_in6)).sin6_addr.s6_addr)),
                _ => None,
            }
        };
        if this == Some(ip) {
            // SAFETY: a NUL-terminated name.
            found = Some(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: the list getifaddrs made.
    unsafe { libc::freeifaddrs(list) };
    match found {
        Some(name) => Ok(name),
        None => bail!("no interface holds {ip}, the references' source address"),
    }
}
