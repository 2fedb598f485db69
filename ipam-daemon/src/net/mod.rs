//! Host networking helpers: raw frames on a link, the frame formats of ARP/NDP, the Service
//! IPs on `lo` that make the node accept their traffic, and the host's link and address
//! changes.

pub mod frames;
pub mod link_changes;
pub mod local_address;
pub mod packet_socket;
