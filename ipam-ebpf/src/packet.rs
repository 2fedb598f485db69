//! Bounds-checked access to a frame's bytes, in the shape the verifier accepts.

/// The bytes of one frame, `[start, end)` as given by the program context.
pub struct Frame {
    start: usize,
    end: usize,
}

impl Frame {
    #[inline(always)]
    pub fn new(start: usize, end: usize) -> Self {
        Self { start, end }
    }

    /// A pointer to a `T` at `offset`, or `None` when the frame is too short to hold it.
    #[inline(always)]
    pub fn ptr_at<T>(&self, offset: usize) -> Option<*mut T> {
        let at = self.start + offset;
        if at + core::mem::size_of::<T>() > self.end {
            return None;
        }
        Some(at as *mut T)
    }
}

// Header layouts from network-types: `#[repr(C)]`, multi-byte fields as byte arrays or raw
// network-order integers (never enums, which arbitrary packet bytes could make invalid).
pub use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};

pub const ETH_HLEN: usize = 14;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;

/// `true` for group (multicast or broadcast) MAC addresses.
#[inline(always)]
pub fn is_group_mac(mac: &[u8; 6]) -> bool {
    mac[0] & 1 != 0
}

/// A MAC address as three halfwords (wire order kept), for copying with 16-bit accesses.
pub type MacWords = [u16; 3];

/// The halfwords of a MAC address stored at an even address (map values are 8-byte aligned and
/// the MACs in them sit at even offsets).
#[inline(always)]
pub fn mac_words(mac: &[u8; 6]) -> MacWords {
    // SAFETY: same size, and the callers' MACs are at even addresses (see above).
    unsafe { *(mac as *const [u8; 6]).cast::<MacWords>() }
}

pub const IPV6_HLEN: usize = 40;

const _: () = assert!(EthHdr::LEN == ETH_HLEN && Ipv6Hdr::LEN == IPV6_HLEN && Ipv4Hdr::LEN == 20);
