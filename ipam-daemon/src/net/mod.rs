//! Host networking helpers: interfaces, raw frames on a link, and the frame formats of ARP/NDP.

pub mod frames;
pub mod iface;
pub mod packet_socket;
