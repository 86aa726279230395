//! The kubelet device-plugin API v1beta1 (generated from `proto/deviceplugin/v1beta1/api.proto`
//! at build time) and the protocol constants the kubelet defines next to it
//! (k8s.io/kubelet `pkg/apis/deviceplugin/v1beta1/constants.go`).

#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod generated {
    tonic::include_proto!("v1beta1");
}
pub use generated::*;

/// The kubelet's pod-resources API v1 (generated from `proto/podresources/v1/api.proto`): which
/// device IDs running containers hold.
pub mod podresources {
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    mod generated {
        tonic::include_proto!("v1");
    }
    pub use generated::*;

    /// Where the kubelet serves the pod-resources API.
    pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
}

/// API version sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// Health value of a usable device in `Device.health`.
pub const HEALTHY: &str = "Healthy";
/// Health value of an unusable device in `Device.health`.
pub const UNHEALTHY: &str = "Unhealthy";
/// File name of the kubelet's registration socket inside the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Default device-plugin directory on a node.
pub const DEFAULT_DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's gRPC receive limit (grpc-go default, 4 MiB). A ListAndWatch message larger
/// than this is dropped by the kubelet, which then reads the resource as 0.
pub const KUBELET_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
