//! Host networking helpers: raw frames on a link, the frame formats of ARP/NDP, and
//! the Service IPs on `lo` that make the node accept their traffic.

pub mod frames;
pub mod local_address;
pub mod packet_socket;
