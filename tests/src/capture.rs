//! Packet captures with tcpdump inside a namespace: the pcap a test reads its ground truth from,
//! or feeds to `pirated replay`; and classic pcap files read and written on the test side, to
//! make the captures in other forms that replay must read alike.

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    process::{Child, ChildStderr, Stdio},
};

use anyhow::{bail, Context, Result};

use crate::netns::Netns;

/// A running tcpdump writing nanosecond timestamps and each frame's first 256 bytes; the file is
/// removed on drop.
pub struct Capture {
    child: Child,
    stderr: BufReader<ChildStderr>,
    path: PathBuf,
}

impl Capture {
    /// Starts capturing on `iface` in `ns`, with tcpdump's `extra` arguments (a direction such as
    /// `-Q in`, a filter expression), and returns once tcpdump listens. Packets reach the file as
    /// they come (immediate mode: libpcap would otherwise hold them until a 1 s timeout).
    pub fn start(ns: &Netns, iface: &str, extra: &[&str]) -> Result<Capture> {
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("pirate-capture-{}-{n}.pcap", std::process::id()));
        let mut args = vec!["tcpdump", "-i", iface, "--immediate-mode", "-U", "-s", "256"];
        args.extend(["--time-stamp-precision=nano", "-w", path.to_str().unwrap()]);
        args.extend(extra);
        let mut child = ns.command(&args).stderr(Stdio::piped()).spawn().context("starting tcpdump")?;
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line)?;
        let capture = Capture { child, stderr, path };
        if !line.contains("listening") {
            bail!("tcpdump: {line}");
        }
        Ok(capture)
    }

    /// The capture file (complete once [`Capture::stop`] returned).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops tcpdump (SIGINT: it flushes and closes the file) and checks that it ended well.
    pub fn stop(&mut self) -> Result<()> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait()?;
        let mut summary = String::new();
        self.stderr.read_to_string(&mut summary)?;
        if !status.success() {
            bail!("tcpdump {status}: {summary}");
        }
        Ok(())
    }

    /// Stops tcpdump and reads the frames it captured, with their timestamps (ns).
    pub fn frames(&mut self) -> Result<Vec<(u64, Vec<u8>)>> {
        self.stop()?;
        pirated::capture::read_all(&self.path)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The lengths of a classic pcap file's header and of each record's.
pub const PCAP_HEADER_LEN: usize = 24;
pub const RECORD_HEADER_LEN: usize = 16;
pub const LINKTYPE_ETHERNET: u32 = 1;
/// The link-type field's flag saying its top four bits hold the FCS length (in 16-bit words).
const FCS_PRESENT: u32 = 0x0400_0000;

/// A captured frame: when (ns since the Unix epoch), its length on the wire, and its bytes as
/// captured (fewer where the snapshot length cut it).
#[derive(Clone, Debug)]
pub struct Record {
    pub ts_ns: u64,
    pub len: u32,
    pub data: Vec<u8>,
}

/// An IPv4 TCP segment in an untagged Ethernet frame: its source, where its source address and
/// port lie in the frame, and its payload's length.
pub struct Tcp4 {
    pub source: SocketAddrV4,
    pub addr_at: usize,
    pub port_at: usize,
    pub payload: usize,
}

impl Record {
    /// An Ethernet frame's ethertype (0 for a frame too short to have one).
    pub fn ethertype(&self) -> u16 {
        self.data.get(12..14).map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
    }

    /// The record with its first `cut` bytes replaced by `head` (one link header swapped for
    /// another), its length on the wire changed alike.
    pub fn reframed(&self, cut: usize, head: &[u8]) -> Record {
        let len = self.len - cut as u32 + head.len() as u32;
        Record { ts_ns: self.ts_ns, len, data: [head, &self.data[cut..]].concat() }
    }

    /// The IPv4 TCP segment the frame carries, if it does.
    pub fn tcp4(&self) -> Option<Tcp4> {
        let d = &self.data;
        if self.ethertype() != 0x0800 || *d.get(23)? != 6 {
            return None;
        }
        let ihl = usize::from(d[14] & 0x0f) * 4;
        let port_at = 14 + ihl;
        let doff = usize::from(*d.get(port_at + 12)? >> 4) * 4;
        let total = usize::from(u16::from_be_bytes([d[16], d[17]]));
        let addr_at = 26;
        let ip = Ipv4Addr::new(d[addr_at], d[addr_at + 1], d[addr_at + 2], d[addr_at + 3]);
        let port = u16::from_be_bytes([d[port_at], d[port_at + 1]]);
        let payload = total.saturating_sub(ihl + doff);
        Some(Tcp4 { source: SocketAddrV4::new(ip, port), addr_at, port_at, payload })
    }
}

/// How a classic pcap file is laid out: byte order, timestamp resolution (ns or µs), and the FCS
/// length (bytes ending each frame, 0 for none) its link-type field announces.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PcapFormat {
    pub big_endian: bool,
    pub nanos: bool,
    pub fcs_len: u32,
}

/// A classic pcap capture, read and written here rather than by pirated, whose reader the replay
/// tests check with the captures they make.
#[derive(Clone, Debug)]
pub struct Pcap {
    pub format: PcapFormat,
    pub link_type: u32,
    pub snaplen: u32,
    pub records: Vec<Record>,
}

impl Pcap {
    /// Parses a whole classic pcap file.
    pub fn parse(bytes: &[u8]) -> Result<Pcap> {
        let header = bytes.get(..PCAP_HEADER_LEN).context("not a pcap file: shorter than its header")?;
        let (big_endian, nanos) = match header[..4] {
            [0xd4, 0xc3, 0xb2, 0xa1] => (false, false),
            [0x4d, 0x3c, 0xb2, 0xa1] => (false, true),
            [0xa1, 0xb2, 0xc3, 0xd4] => (true, false),
            [0xa1, 0xb2, 0x3c, 0x4d] => (true, true),
            ref magic => bail!("not a classic pcap file (magic {magic:02x?})"),
        };
        let u32_at = |b: &[u8], at: usize| {
            let word = b[at..at + 4].try_into().unwrap();
            if big_endian {
                u32::from_be_bytes(word)
            } else {
                u32::from_le_bytes(word)
            }
        };
        let link = u32_at(header, 20);
        let fcs_len = if link & FCS_PRESENT != 0 { (link >> 28) * 2 } else { 0 };
        let mut records = Vec::new();
        let mut rest = &bytes[PCAP_HEADER_LEN..];
        while !rest.is_empty() {
            let truncated = || format!("record {} truncated", records.len());
            let h = rest.get(..RECORD_HEADER_LEN).with_context(truncated)?;
            let end = RECORD_HEADER_LEN + u32_at(h, 8) as usize;
            let data = rest.get(RECORD_HEADER_LEN..end).with_context(truncated)?.to_vec();
            let frac = u64::from(u32_at(h, 4)) * if nanos { 1 } else { 1000 };
            records.push(Record { ts_ns: u64::from(u32_at(h, 0)) * 1_000_000_000 + frac, len: u32_at(h, 12), data });
            rest = &rest[end..];
        }
        let format = PcapFormat { big_endian, nanos, fcs_len };
        Ok(Pcap { format, link_type: link & 0xffff, snaplen: u32_at(header, 16), records })
    }

    /// The same capture with each record mapped by `f` (`None` leaves it out), on `link_type`;
    /// the snapshot length grows to the longest record.
    pub fn map(&self, link_type: u32, f: impl FnMut(&Record) -> Option<Record>) -> Pcap {
        let records: Vec<Record> = self.records.iter().filter_map(f).collect();
        let snaplen = records.iter().map(|r| r.data.len() as u32).fold(self.snaplen, u32::max);
        Pcap { format: self.format, link_type, snaplen, records }
    }

    /// A writer of records in this capture's format, its file header written.
    pub fn writer<W: Write>(&self, out: W) -> io::Result<PcapWriter<W>> {
        PcapWriter::new(out, self.format, self.link_type, self.snaplen)
    }

    /// The capture as a file's bytes.
    pub fn to_bytes(&self) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        let mut w = self.writer(&mut bytes)?;
        self.records.iter().try_for_each(|r| w.record(r))?;
        Ok(bytes)
    }
}

/// Writes a classic pcap a record at a time (for captures too large to hold).
pub struct PcapWriter<W> {
    out: W,
    format: PcapFormat,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header: `format`'s magic and FCS bits, frames of `link_type` cut at
    /// `snaplen` bytes.
    pub fn new(out: W, format: PcapFormat, link_type: u32, snaplen: u32) -> io::Result<Self> {
        let mut w = PcapWriter { out, format };
        let fcs = if format.fcs_len > 0 { FCS_PRESENT | (format.fcs_len / 2) << 28 } else { 0 };
        w.words(&[if format.nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 }])?;
        // Version 2.4 (two 16-bit fields), no time zone offset, no accuracy.
        let version = if format.big_endian { [0, 2, 0, 4] } else { [2, 0, 4, 0] };
        w.out.write_all(&version)?;
        w.words(&[0, 0, snaplen, link_type | fcs])?;
        Ok(w)
    }

    /// Writes one record; its timestamp in µs if the format says so (the ns below them dropped).
    pub fn record(&mut self, r: &Record) -> io::Result<()> {
        let seconds = u32::try_from(r.ts_ns / 1_000_000_000)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a timestamp beyond pcap's 32-bit seconds"))?;
        let frac = (r.ts_ns % 1_000_000_000) as u32 / if self.format.nanos { 1 } else { 1000 };
        self.words(&[seconds, frac, r.data.len() as u32, r.len])?;
        self.out.write_all(&r.data)
    }

    fn words(&mut self, words: &[u32]) -> io::Result<()> {
        let be = self.format.big_endian;
        words.iter().try_for_each(|w| self.out.write_all(&if be { w.to_be_bytes() } else { w.to_le_bytes() }))
    }
}
