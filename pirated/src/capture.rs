//! Capture files as a stream of frames: classic pcap and pcapng (read with `pcap-parser`), in
//! either byte order and at any timestamp resolution, each frame handed over as the Ethernet
//! frame the datapath's parser reads (cooked and raw-IP link types get a header made up, an FCS
//! is cut off). Memory stays constant whatever the capture's size: one block at a time.

use std::{
    collections::BTreeMap,
    fmt,
    fs::File,
    io::Read,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail};
use pcap_parser::{
    create_reader,
    traits::{PcapNGPacketBlock, PcapReaderIterator},
    Block, InterfaceDescriptionBlock, Linktype, OptionCode, PcapBlockOwned, PcapError,
};

/// The reader's buffer to start with, and the largest it grows to, to hold one block (a record
/// longer than that is a corrupt length, not a frame).
const BUFFER: usize = 1 << 18;
const MAX_BLOCK: usize = 1 << 26;
/// A record whose timestamp lies further than this from both its neighbours' is corrupt.
pub const JUMP_NS: u64 = 1_000_000_000;
/// The pcapng option holding an interface's FCS length in bytes (`if_fcslen`).
const IF_FCSLEN: OptionCode = OptionCode(13);

const ETH_HEADER: usize = 14;
const ETH_P_IPV4: [u8; 2] = [0x08, 0x00];
const ETH_P_IPV6: [u8; 2] = [0x86, 0xdd];

/// Frames left out, by reason (the reader's, and the parser's its users add).
#[derive(Default)]
pub struct Refused(BTreeMap<&'static str, u64>);

impl Refused {
    pub fn add(&mut self, reason: &'static str) {
        *self.0.entry(reason).or_default() += 1;
    }

    /// Adds `other`'s counts.
    pub fn absorb(&mut self, other: Refused) {
        for (reason, n) in other.0 {
            *self.0.entry(reason).or_default() += n;
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.0.iter().map(|(k, v)| (k.to_string(), (*v).into())).collect())
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{v} {k}")).collect();
        f.write_str(&parts.join(", "))
    }
}

/// What a replay read of one capture, took and left out, and the error that ended it early
/// (truncated, corrupt: everything before it counts).
#[derive(Default)]
pub struct Tally {
    pub records: u64,
    pub replayed: u64,
    pub refused: Refused,
    pub error: Option<anyhow::Error>,
}

impl Tally {
    /// The reader's counts once it is done, with the replay's own refusals.
    pub fn finish(&mut self, reader: CaptureReader) {
        self.records = reader.records;
        self.refused.absorb(reader.refused);
    }

    /// A `"type": "capture"` JSON line, with `more` fields.
    pub fn json(&self, more: serde_json::Value) -> serde_json::Value {
        let mut line = serde_json::json!({
            "type": "capture",
            "frames": self.records,
            "replayed": self.replayed,
            "refused": self.refused.json(),
            "complete": self.error.is_none(),
            "error": self.error.as_ref().map(|e| format!("{e:#}")),
        });
        if let (Some(line), serde_json::Value::Object(more)) = (line.as_object_mut(), more) {
            line.extend(more);
        }
        line
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} records, {} replayed; left out: {}", self.records, self.replayed, self.refused)?;
        if self.error.is_some() {
            f.write_str("; ended early")?;
        }
        Ok(())
    }
}

/// Every frame of the capture at `path`, in memory: for small captures (a test's ground truth).
pub fn read_all(path: &Path) -> anyhow::Result<Vec<(u64, Vec<u8>)>> {
    let mut reader = CaptureReader::open(path)?;
    let mut frames = Vec::new();
    while let Some((ts, frame)) = reader.frame()? {
        frames.push((ts, frame.to_vec()));
    }
    Ok(frames)
}

/// How an interface's frames become Ethernet frames.
#[derive(Clone, Copy)]
enum Link {
    /// Ethernet, with `fcs` bytes of frame check sequence at the end.
    Ethernet {
        fcs: usize,
    },
    /// Linux cooked capture v1 (`tcpdump -i any`): 16 bytes, the protocol in the last two.
    Cooked1,
    /// Linux cooked capture v2: 20 bytes, the protocol in the first two.
    Cooked2,
    /// An IP packet with no link header (raw, IPv4 or IPv6): its version nibble tells which.
    Raw,
    Unsupported,
}

impl Link {
    fn new(linktype: u16, fcs: usize) -> Link {
        match Linktype(linktype.into()) {
            Linktype::ETHERNET => Link::Ethernet { fcs },
            Linktype::LINUX_SLL => Link::Cooked1,
            Linktype::LINUX_SLL2 => Link::Cooked2,
            Linktype::RAW | Linktype::IPV4 | Linktype::IPV6 => Link::Raw,
            _ => Link::Unsupported,
        }
    }

    /// `data` as an Ethernet frame in `out`, or why not.
    fn ethernet(self, data: &[u8], out: &mut Vec<u8>) -> Result<(), &'static str> {
        out.clear();
        let (ethertype, l3) = match self {
            Link::Ethernet { fcs } => {
                if data.len() < ETH_HEADER + fcs {
                    return Err("short");
                }
                out.extend_from_slice(&data[..data.len() - fcs]);
                return Ok(());
            }
            Link::Cooked1 if data.len() >= 16 => ([data[14], data[15]], &data[16..]),
            Link::Cooked2 if data.len() >= 20 => ([data[0], data[1]], &data[20..]),
            Link::Raw => match data.first().map(|v| v >> 4) {
                Some(4) => (ETH_P_IPV4, data),
                Some(6) => (ETH_P_IPV6, data),
                Some(_) => return Err("not_ip"),
                None => return Err("short"),
            },
            Link::Unsupported => return Err("link_type"),
            Link::Cooked1 | Link::Cooked2 => return Err("short"),
        };
        out.extend_from_slice(&[0; 12]);
        out.extend_from_slice(&ethertype);
        out.extend_from_slice(l3);
        Ok(())
    }
}

/// A pcapng interface (or a classic file's one link): its link and clock.
#[derive(Clone, Copy)]
struct Interface {
    link: Link,
    /// Timestamp units per second, and the seconds added to each.
    resolution: u64,
    offset_s: i64,
}

impl Interface {
    fn ng(idb: &InterfaceDescriptionBlock) -> Interface {
        let fcs = idb.options.iter().find(|o| o.code == IF_FCSLEN).and_then(|o| o.value.first()).copied();
        Interface {
            link: Link::new(idb.linktype.0 as u16, fcs.unwrap_or(0).into()),
            // An invalid resolution leaves the default (microseconds), as readers do.
            resolution: idb.ts_resolution().unwrap_or(1_000_000),
            offset_s: idb.ts_offset(),
        }
    }

    fn ns(&self, units: u64) -> u64 {
        let ns = u128::from(units) * 1_000_000_000 / u128::from(self.resolution.max(1));
        (ns as u64).saturating_add_signed(self.offset_s.saturating_mul(1_000_000_000))
    }
}

/// A capture file read frame by frame. A record whose timestamp jumps away from both its
/// neighbours (a corrupt record) is left out and counted as `timestamp`.
pub struct CaptureReader {
    reader: Box<dyn PcapReaderIterator + Send>,
    /// The reader's buffer size.
    capacity: usize,
    path: PathBuf,
    interfaces: Vec<Interface>,
    /// The last record's timestamp (pcapng's simple packets carry none).
    last_record_ns: u64,
    /// The next frame, held back until the one after shows whether its timestamp is sound.
    held: Option<(u64, Vec<u8>)>,
    /// The last frame handed over, and a buffer to read into.
    current: Vec<u8>,
    spare: Vec<u8>,
    last_ns: Option<u64>,
    ended: bool,
    /// The error that ended the file, handed over after the frames before it.
    error: Option<anyhow::Error>,
    /// Packet records read.
    pub records: u64,
    pub refused: Refused,
}

impl CaptureReader {
    /// Opens `path` (`-`: standard input), pcap or pcapng.
    pub fn open(path: &Path) -> anyhow::Result<CaptureReader> {
        let input: Box<dyn Read + Send> = if path == Path::new("-") {
            Box::new(std::io::stdin())
        } else {
            Box::new(File::open(path).map_err(|e| anyhow!("opening {}: {e}", path.display()))?)
        };
        CaptureReader::new(input, path)
    }

    /// Reads a capture from `input`, named `path` in messages.
    pub fn new(input: Box<dyn Read + Send>, path: &Path) -> anyhow::Result<CaptureReader> {
        let reader = create_reader(BUFFER, input).map_err(|e| match e {
            PcapError::Eof => anyhow!("{}: empty, not a capture", path.display()),
            PcapError::HeaderNotRecognized => {
                anyhow!("{}: neither pcap nor pcapng (its first bytes are no capture header)", path.display())
            }
            e => anyhow!("{}: {e}", path.display()),
        })?;
        Ok(CaptureReader {
            reader,
            capacity: BUFFER,
            path: path.to_owned(),
            interfaces: Vec::new(),
            last_record_ns: 0,
            held: None,
            current: Vec::new(),
            spare: Vec::new(),
            last_ns: None,
            ended: false,
            error: None,
            records: 0,
            refused: Refused::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next frame, as (timestamp in ns since 1970, Ethernet frame); `None` at the end. An
    /// error (a truncated or corrupt file) comes after every frame before it.
    pub fn frame(&mut self) -> anyhow::Result<Option<(u64, &[u8])>> {
        let far = |a: u64, b: u64| a.abs_diff(b) > JUMP_NS;
        loop {
            let after = self.read_ahead();
            let Some((ts, frame)) = std::mem::replace(&mut self.held, after) else {
                if self.held.is_some() {
                    continue;
                }
                return self.error.take().map_or(Ok(None), Err);
            };
            if let (Some(prev), Some((next, _))) = (self.last_ns, &self.held) {
                if far(ts, prev) && !far(*next, prev) {
                    self.refused.add("timestamp");
                    self.spare = frame;
                    continue;
                }
            }
            self.last_ns = Some(ts);
            self.spare = std::mem::replace(&mut self.current, frame);
            return Ok(Some((ts, &self.current)));
        }
    }

    /// The frame after the held one, unless the file ended or failed (kept for later).
    fn read_ahead(&mut self) -> Option<(u64, Vec<u8>)> {
        if self.ended || self.error.is_some() {
            return None;
        }
        let mut buf = std::mem::take(&mut self.spare);
        match self.read(&mut buf) {
            Ok(Some(ts)) => return Some((ts, buf)),
            Ok(None) => self.ended = true,
            Err(e) => self.error = Some(e),
        }
        self.spare = buf;
        None
    }

    /// Reads blocks up to the next usable frame, into `out`; its timestamp.
    fn read(&mut self, out: &mut Vec<u8>) -> anyhow::Result<Option<u64>> {
        loop {
            let (consumed, frame) = match self.reader.next() {
                Ok((consumed, block)) => {
                    let frame = match &block {
                        PcapBlockOwned::LegacyHeader(h) => {
                            let lt = h.network.0 as u32;
                            // The link-type field's top bits: an FCS length (16-bit words) if flagged.
                            let fcs = if lt & 0x0400_0000 != 0 { (lt >> 28) as usize * 2 } else { 0 };
                            let resolution = if h.is_nanosecond_precision() { 1_000_000_000 } else { 1_000_000 };
                            self.interfaces =
                                vec![Interface { link: Link::new(lt as u16, fcs), resolution, offset_s: 0 }];
                            None
                        }
                        PcapBlockOwned::Legacy(b) => {
                            let units = u64::from(b.ts_sec) * self.interfaces[0].resolution + u64::from(b.ts_usec);
                            Some((0, Some(units), b.data))
                        }
                        PcapBlockOwned::NG(Block::SectionHeader(_)) => {
                            self.interfaces.clear();
                            None
                        }
                        PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
                            self.interfaces.push(Interface::ng(idb));
                            None
                        }
                        PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => {
                            let units = (u64::from(epb.ts_high) << 32) | u64::from(epb.ts_low);
                            Some((epb.if_id as usize, Some(units), epb.packet_data()))
                        }
                        // Interface 0, and no timestamp: the last record's.
                        PcapBlockOwned::NG(Block::SimplePacket(spb)) => Some((0, None, spb.packet_data())),
                        PcapBlockOwned::NG(_) => None,
                    };
                    let frame = frame.map(|(interface, units, data)| {
                        self.records += 1;
                        let i = self.interfaces.get(interface).ok_or("interface")?;
                        let ts = units.map_or(self.last_record_ns, |u| i.ns(u));
                        self.last_record_ns = ts;
                        i.link.ethernet(data, out).map(|()| ts)
                    });
                    (consumed, frame)
                }
                Err(PcapError::Eof) => return Ok(None),
                Err(PcapError::Incomplete(_)) => {
                    self.refill()?;
                    continue;
                }
                Err(PcapError::BufferTooSmall) => {
                    self.capacity *= 2;
                    if self.capacity > MAX_BLOCK || !self.reader.grow(self.capacity) {
                        bail!(
                            "{}: a block of over {} MiB after {} records: a corrupt length",
                            self.path.display(),
                            MAX_BLOCK >> 20,
                            self.records
                        );
                    }
                    self.refill()?;
                    continue;
                }
                Err(PcapError::UnexpectedEof) => {
                    bail!(
                        "{}: truncated: the file ends inside a record, after {} records",
                        self.path.display(),
                        self.records
                    )
                }
                Err(e) => bail!("{}: corrupt after {} records: {e}", self.path.display(), self.records),
            };
            self.reader.consume(consumed);
            match frame {
                Some(Ok(ts)) => return Ok(Some(ts)),
                Some(Err(reason)) => self.refused.add(reason),
                None => {}
            }
        }
    }

    fn refill(&mut self) -> anyhow::Result<()> {
        self.reader.refill().map_err(|e| anyhow!("reading {}: {e}", self.path.display()))
    }
}
