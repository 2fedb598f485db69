//! Taking a dead node's pods out of their Services' endpoints: the decisions, as pure
//! functions of what a node knows and of the time it is given (never read). The daemon runs
//! them and carries out what they return (the probes, the record writes, the pods' patches);
//! `ipam-sim` runs the same functions on every node of a modelled cluster, and checks that no
//! live node's pods are ever marked.
//!
//! - `reports`: an agent's half: the nodes its gossip declared dead, checked on a second
//!   signal a live host gives whatever its firewall does, become its record's reports;
//! - `marking`: the operator's half: the nodes a majority reports, marked at a bounded pace,
//!   once per death, left to the leader for a moment when another replica leads.

pub mod marking;
pub mod reports;
