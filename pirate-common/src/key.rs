//! The flow key every capability shares: the root writes it into the packet context, the flow
//! tables are keyed on it, and the flow hash reads it.

pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;

/// Direction-aware 5-tuple: client→server and server→client are different flows.
/// IPv4 addresses sit in the first 4 bytes of `src`/`dst`, the rest zero. 8-byte aligned so that
/// the flow hash reads it as words.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Host byte order.
    pub sport: u16,
    pub dport: u16,
    /// IP protocol number (6 TCP, 17 UDP).
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    pub _pad: [u8; 2],
}

const _: () = assert!(size_of::<FlowKey>() == 40);

// SAFETY: plain data, no padding (fields fill 40 bytes exactly).
#[cfg(feature = "user")]
unsafe impl aya::Pod for FlowKey {}
