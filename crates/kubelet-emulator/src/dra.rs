//! The kubelet's side of DRA, for the integration tests: it finds a plugin's registration
//! socket in a plugin registry directory (as the kubelet's plugin watcher does), calls
//! `GetInfo`, checks the answer, confirms with `NotifyRegistrationStatus`, dials the endpoint
//! and calls `NodePrepareResources` / `NodeUnprepareResources` in either API version. Its
//! health watcher ([`DraKubelet::watch_health`]) opens `NodeWatchResources` as the kubelet
//! does after registration (v1 from 1.37 on, v1alpha1 before) and records every message.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tonic::transport::Channel;

use slicelet::api::{dra, drahealth, pluginregistration};
use slicelet::kubelet::connect;
use tokio::sync::watch;

/// Which DRA API version to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `k8s.io.kubelet.pkg.apis.dra.v1` (kubelets 1.34 and newer).
    V1,
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1` (older kubelets).
    V1beta1,
}

/// The `share_id` of a prepared device: v1 carries it, v1beta1 has no such field.
macro_rules! share_id {
    (v1, $d:expr) => {
        $d.share_id
    };
    (v1beta1, $d:expr) => {
        None
    };
}

/// A claim as the kubelet names it: (namespace, name, UID).
pub type Claim<'a> = (&'a str, &'a str, &'a str);

/// One device of a prepared claim, as the plugin answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Requests it was allocated for.
    pub requests: Vec<String>,
    /// Pool.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// CDI device IDs.
    pub cdi_ids: Vec<String>,
    /// The share of a consumable-capacity device the plugin prepared (`share_id`, v1 only;
    /// `None` when unset and always in v1beta1).
    pub share_id: Option<String>,
}

/// The answer for one claim: its devices, or an error (empty when none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    /// Devices (empty on error).
    pub devices: Vec<Device>,
    /// The plugin's error for the claim; empty on success.
    pub error: String,
}

/// A DRA plugin the emulated kubelet registered.
pub struct DraKubelet {
    /// The registration socket found.
    pub registration: PathBuf,
    /// What `GetInfo` answered.
    pub info: pluginregistration::PluginInfo,
    channel: Channel,
}

/// Registration or dialing failed.
#[derive(Debug, thiserror::Error)]
pub enum DraKubeletError {
    /// No `*-reg.sock` in the directory.
    #[error("no registration socket in {0}")]
    NoSocket(PathBuf),
    /// Dialing failed.
    #[error("dialing {0}: {1}")]
    Dial(PathBuf, tonic::transport::Error),
    /// A call failed.
    #[error("{0}: {1}")]
    Call(&'static str, tonic::Status),
    /// `GetInfo` answered something the kubelet refuses.
    #[error("GetInfo: {0}")]
    Refused(String),
}

impl DraKubelet {
    /// Finds the registration socket in `registry`, calls `GetInfo` (type `DRAPlugin`, a
    /// version the kubelet speaks), notifies the plugin that it is registered, and dials the
    /// endpoint.
    ///
    /// # Errors
    /// [`DraKubeletError`].
    pub async fn register(registry: &Path) -> Result<DraKubelet, DraKubeletError> {
        let registration = std::fs::read_dir(registry)
            .map_err(|_| DraKubeletError::NoSocket(registry.to_path_buf()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().ends_with("-reg.sock"))
            })
            .ok_or_else(|| DraKubeletError::NoSocket(registry.to_path_buf()))?;
        let ch = connect(&registration)
            .await
            .map_err(|e| DraKubeletError::Dial(registration.clone(), e))?;
        let mut reg = pluginregistration::registration_client::RegistrationClient::new(ch);
        let info = reg
            .get_info(pluginregistration::InfoRequest {})
            .await
            .map_err(|s| DraKubeletError::Call("GetInfo", s))?
            .into_inner();
        if info.r#type != pluginregistration::DRA_PLUGIN {
            return Err(DraKubeletError::Refused(format!("type {}", info.r#type)));
        }
        if !info
            .supported_versions
            .iter()
            .any(|v| v == "v1.DRAPlugin" || v == "v1beta1.DRAPlugin")
        {
            return Err(DraKubeletError::Refused(format!(
                "versions {:?}",
                info.supported_versions
            )));
        }
        let endpoint = PathBuf::from(&info.endpoint);
        let channel = connect(&endpoint)
            .await
            .map_err(|e| DraKubeletError::Dial(endpoint.clone(), e))?;
        reg.notify_registration_status(pluginregistration::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .map_err(|s| DraKubeletError::Call("NotifyRegistrationStatus", s))?;
        Ok(DraKubelet {
            registration,
            info,
            channel,
        })
    }

    /// `NodePrepareResources` for `claims` in `version`: the answer per claim UID.
    ///
    /// # Errors
    /// [`DraKubeletError::Call`] when the call itself fails.
    pub async fn prepare(
        &self,
        version: Version,
        claims: &[Claim<'_>],
    ) -> Result<BTreeMap<String, Answer>, DraKubeletError> {
        macro_rules! call {
            ($v:ident) => {{
                let mut c = dra::$v::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = dra::$v::NodePrepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|(namespace, name, uid)| dra::$v::Claim {
                            namespace: namespace.to_string(),
                            name: name.to_string(),
                            uid: uid.to_string(),
                        })
                        .collect(),
                };
                let resp = c
                    .node_prepare_resources(req)
                    .await
                    .map_err(|s| DraKubeletError::Call("NodePrepareResources", s))?
                    .into_inner();
                resp.claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let devices = r
                            .devices
                            .into_iter()
                            .map(|d| Device {
                                requests: d.request_names,
                                pool: d.pool_name,
                                device: d.device_name,
                                cdi_ids: d.cdi_device_ids,
                                share_id: share_id!($v, d),
                            })
                            .collect();
                        (
                            uid,
                            Answer {
                                devices,
                                error: r.error,
                            },
                        )
                    })
                    .collect()
            }};
        }
        Ok(match version {
            Version::V1 => call!(v1),
            Version::V1beta1 => call!(v1beta1),
        })
    }

    /// `NodeUnprepareResources` for `claims` in `version`: the error per claim UID (empty on
    /// success).
    ///
    /// # Errors
    /// [`DraKubeletError::Call`] when the call itself fails.
    pub async fn unprepare(
        &self,
        version: Version,
        claims: &[Claim<'_>],
    ) -> Result<BTreeMap<String, String>, DraKubeletError> {
        macro_rules! call {
            ($v:ident) => {{
                let mut c = dra::$v::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = dra::$v::NodeUnprepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|(namespace, name, uid)| dra::$v::Claim {
                            namespace: namespace.to_string(),
                            name: name.to_string(),
                            uid: uid.to_string(),
                        })
                        .collect(),
                };
                c.node_unprepare_resources(req)
                    .await
                    .map_err(|s| DraKubeletError::Call("NodeUnprepareResources", s))?
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|(uid, r)| (uid, r.error))
                    .collect()
            }};
        }
        Ok(match version {
            Version::V1 => call!(v1),
            Version::V1beta1 => call!(v1beta1),
        })
    }
}

/// Which DRAResourceHealth version to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthVersion {
    /// `v1.DRAResourceHealth` (kubelets 1.37 and newer).
    V1,
    /// `v1alpha1.DRAResourceHealth` (kubelets 1.34 to 1.36).
    V1alpha1,
}

/// One device's entry in a health message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    /// The pool.
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
    /// `Healthy`, `Unhealthy` or `Unknown`.
    pub health: String,
    /// `last_updated_time`, Unix seconds.
    pub last_updated: i64,
    /// `health_check_timeout_seconds`.
    pub timeout_seconds: i64,
    /// `message`.
    pub message: String,
}

/// What a health stream delivered so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthLog {
    /// Every message, in order (each the full list of the driver's devices).
    pub messages: Vec<Vec<DeviceHealth>>,
    /// How the stream ended (`None` while open): `ok` or the error.
    pub ended: Option<String>,
}

/// A `NodeWatchResources` stream the emulated kubelet holds open, recording every message;
/// dropping it closes the stream.
pub struct HealthWatch {
    log: watch::Receiver<HealthLog>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HealthWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HealthWatch {
    /// What was recorded so far.
    pub fn log(&self) -> HealthLog {
        self.log.borrow().clone()
    }

    /// Waits up to `timeout` for a message at or after index `after` that satisfies `pred`,
    /// and returns its index and devices.
    ///
    /// # Errors
    /// After `timeout`, or when the stream ended first: a sentence with what was recorded.
    pub async fn wait_message(
        &self,
        after: usize,
        timeout: std::time::Duration,
        mut pred: impl FnMut(&[DeviceHealth]) -> bool,
    ) -> Result<(usize, Vec<DeviceHealth>), String> {
        let mut rx = self.log.clone();
        let wait = async {
            loop {
                {
                    let log = rx.borrow_and_update();
                    if let Some((i, m)) = log
                        .messages
                        .iter()
                        .enumerate()
                        .skip(after)
                        .find(|(_, m)| pred(m))
                    {
                        return Ok((i, m.clone()));
                    }
                    if let Some(e) = &log.ended {
                        return Err(format!("the health stream ended ({e}): {:?}", log.messages));
                    }
                }
                if rx.changed().await.is_err() {
                    return Err("the health watcher is gone".to_string());
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no health message after #{after} matched within {timeout:?}: {:?}",
                    self.log().messages.iter().skip(after).collect::<Vec<_>>()
                ))
            })
    }
}

macro_rules! health_entries {
    ($v:ident, $msg:expr) => {
        $msg.devices
            .into_iter()
            .map(|d| {
                let id = d.device.unwrap_or_default();
                DeviceHealth {
                    pool: id.pool_name,
                    device: id.device_name,
                    health: match drahealth::$v::HealthStatus::try_from(d.health) {
                        Ok(drahealth::$v::HealthStatus::Healthy) => "Healthy",
                        Ok(drahealth::$v::HealthStatus::Unhealthy) => "Unhealthy",
                        _ => "Unknown",
                    }
                    .to_string(),
                    last_updated: d.last_updated_time,
                    timeout_seconds: d.health_check_timeout_seconds,
                    message: d.message,
                }
            })
            .collect::<Vec<_>>()
    };
}

impl DraKubelet {
    /// Opens `NodeWatchResources` in `version` on the plugin's endpoint (as the kubelet does
    /// once a plugin lists the service) and records every message until the stream ends or
    /// the watch is dropped.
    ///
    /// # Errors
    /// [`DraKubeletError::Call`] when the call itself fails (say, `Unimplemented`).
    pub async fn watch_health(
        &self,
        version: HealthVersion,
    ) -> Result<HealthWatch, DraKubeletError> {
        let (tx, log) = watch::channel(HealthLog::default());
        macro_rules! open {
            ($v:ident) => {{
                let mut c = drahealth::$v::dra_resource_health_client::DraResourceHealthClient::new(
                    self.channel.clone(),
                );
                let mut stream = c
                    .node_watch_resources(drahealth::$v::NodeWatchResourcesRequest {})
                    .await
                    .map_err(|s| DraKubeletError::Call("NodeWatchResources", s))?
                    .into_inner();
                tokio::spawn(async move {
                    loop {
                        match stream.message().await {
                            Ok(Some(m)) => {
                                let entries = health_entries!($v, m);
                                tx.send_modify(|l| l.messages.push(entries));
                            }
                            Ok(None) => {
                                tx.send_modify(|l| l.ended = Some("ok".to_string()));
                                return;
                            }
                            Err(e) => {
                                tx.send_modify(|l| l.ended = Some(e.to_string()));
                                return;
                            }
                        }
                    }
                })
            }};
        }
        let task = match version {
            HealthVersion::V1 => open!(v1),
            HealthVersion::V1alpha1 => open!(v1alpha1),
        };
        Ok(HealthWatch { log, task })
    }
}
