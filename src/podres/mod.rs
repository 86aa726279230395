//! The kubelet's pod-resources API v1: [`client::list`] asks it which device IDs running
//! containers hold, as an [`InUse`](crate::in_use::InUse) snapshot (the pure side, with its
//! parsing of the answer, is [`crate::in_use`]).

pub mod client;
