//! The kubelet's side of DRA, for the integration tests: it finds a plugin's registration
//! socket in a plugin registry directory (as the kubelet's plugin watcher does), calls
//! `GetInfo`, checks the answer, confirms with `NotifyRegistrationStatus`, dials the endpoint
//! and calls `NodePrepareResources` / `NodeUnprepareResources` in either API version.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tonic::transport::Channel;

use slicelet::api::{dra, pluginregistration};
use slicelet::kubelet::connect;

/// Which DRA API version to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `k8s.io.kubelet.pkg.apis.dra.v1` (kubelets 1.34 and newer).
    V1,
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1` (older kubelets).
    V1beta1,
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
