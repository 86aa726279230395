//! slicelet: a Kubernetes device plugin that shares NVIDIA GPUs.
//!
//! The data flow, each step with one home:
//!
//! ```text
//! policy file ──policy::load──▶ Policy ─┐
//! NVML / --simulate ─▶ Inventory ───────┴─▶ plan::build ─▶ Arc<Plan> ─watch─▶ plugin servers ─▶ kubelet
//!                                                               Allocate ─▶ allocate.rs ─▶ response
//! ```
//!
//! [`plan`] and [`allocate`] are pure: no I/O, no async. [`policy`] is pure but for reading
//! files ([`policy::load`] through [`policy::read_bounded`], and [`policy::select::config_keys`]
//! listing a directory of named configs); its parsing and validation ([`policy::parse`]) are
//! pure, and none of it is async. [`daemon`] is the one supervisor that owns state and publishes
//! plan snapshots; [`plugin`] serves the kubelet's v1beta1 `DevicePlugin` API per resource;
//! [`kubelet`] registers with the kubelet;
//! [`inventory`] discovers GPUs through NVML or a simulated node file.

pub mod allocate;
pub mod api;
pub mod authority;
pub mod cdi;
pub mod cli;
pub mod commands;
pub mod daemon;
pub mod device_health;
pub mod dra;
pub mod errors;
pub mod files;
pub mod health_tracker;
pub mod hook;
pub mod in_use;
pub mod inventory;
pub mod k8s;
pub mod kubelet;
pub mod labels;
pub mod listen;
pub mod mps;
pub mod plan;
pub mod plugin;
pub mod podres;
pub mod policy;
pub mod residency;
pub mod settings;
pub mod status;
pub mod top;
pub mod usage;
pub mod uuid;
pub mod watch;
