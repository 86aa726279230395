//! Dynamic Resource Allocation (`resource.k8s.io/v1`, GA in Kubernetes 1.34): the same plan the
//! device plugin serves, published as ResourceSlices and prepared through the kubelet's DRA
//! plugin API.
//!
//! - [`slices`] (pure): a plan's DRA resources and the inventory → the node's ResourceSlices.

pub mod slices;
