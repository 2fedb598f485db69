//! Host networking helpers: raw frames on a link, the frame formats of ARP/NDP, the Service
//! IPs on `lo` that make the node accept their traffic, the host's link and address changes,
//! and asking a segment whether the host of an address runs (`neighbour`).

pub mod frames;
pub mod link_changes;
pub mod local_address;
pub mod neighbour;
pub mod packet_socket;
