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

/// The kubelet's plugin registration API v1 (package `pluginregistration`, generated from
/// `proto/pluginregistration/v1/api.proto`): how a DRA plugin announces itself through a
/// socket in the kubelet's plugin registry directory (the kubelet dials it and calls
/// `GetInfo`).
pub mod pluginregistration {
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    mod generated {
        tonic::include_proto!("pluginregistration");
    }
    pub use generated::*;

    /// `PluginInfo.type` of a DRA kubelet plugin (k8s.io/kubelet `pluginregistration/v1`
    /// `DRAPlugin`).
    pub const DRA_PLUGIN: &str = "DRAPlugin";
    /// The kubelet's plugin registry directory on a node.
    pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
}

/// The kubelet's DRA plugin API (`k8s.io.kubelet.pkg.apis.dra.*`): `NodePrepareResources` and
/// `NodeUnprepareResources`, in both versions the kubelet speaks (1.34 and newer call v1,
/// older ones only v1beta1; the messages are the same).
pub mod dra {
    /// Version v1 (generated from `proto/dra/v1/api.proto`).
    pub mod v1 {
        #[allow(missing_docs, clippy::all, clippy::pedantic)]
        mod generated {
            tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
        }
        pub use generated::*;
    }
    /// Version v1beta1 (generated from `proto/dra/v1beta1/api.proto`).
    pub mod v1beta1 {
        #[allow(missing_docs, clippy::all, clippy::pedantic)]
        mod generated {
            tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
        }
        pub use generated::*;
    }
    /// `supported_versions` a DRA plugin answers in `GetInfo`: the gRPC service names the
    /// kubelet may call (k8s.io/kubelet `pkg/apis/dra/{v1,v1beta1}` `DRAPluginService`, and
    /// `pkg/apis/dra-health/{v1,v1alpha1}` `DRAResourceHealthService`: see [`super::drahealth`]).
    pub const SUPPORTED_VERSIONS: [&str; 4] = [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        super::drahealth::V1_SERVICE,
        super::drahealth::V1ALPHA1_SERVICE,
    ];
    /// Default directory the DRA plugins' own sockets live under (`<dir>/<driver>/dra.sock`).
    pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
}

/// The kubelet's DRA resource health API (KEP-4680, `k8s.io/kubelet pkg/apis/dra-health`):
/// `NodeWatchResources`, a stream of every device's health from the driver to the kubelet,
/// which shows it in the status of the pods using the devices. Kubelets 1.37 and newer call v1;
/// 1.34 to 1.36 (feature gate `ResourceHealthStatus`) call v1alpha1; the messages are the same.
pub mod drahealth {
    /// Version v1 (generated from `proto/drahealth/v1/api.proto`, protobuf package `v1`).
    pub mod v1 {
        #[allow(missing_docs, clippy::all, clippy::pedantic)]
        mod generated {
            include!(concat!(env!("OUT_DIR"), "/drahealth/v1.rs"));
        }
        pub use generated::*;
    }
    /// Version v1alpha1 (generated from `proto/drahealth/v1alpha1/api.proto`).
    pub mod v1alpha1 {
        #[allow(missing_docs, clippy::all, clippy::pedantic)]
        mod generated {
            include!(concat!(env!("OUT_DIR"), "/drahealth/v1alpha1.rs"));
        }
        pub use generated::*;
    }
    /// The v1 service's name in `supported_versions` (k8s.io/kubelet
    /// `dra-health/v1.DRAResourceHealthService`).
    pub const V1_SERVICE: &str = "v1.DRAResourceHealth";
    /// The v1alpha1 service's name in `supported_versions` (k8s.io/kubelet
    /// `dra-health/v1alpha1.DRAResourceHealthService`).
    pub const V1ALPHA1_SERVICE: &str = "v1alpha1.DRAResourceHealth";
    /// `message` is at most this many characters (the kubelet truncates longer ones).
    pub const MAX_MESSAGE: usize = 1024;
}

/// API version sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";

/// The options slicelet announces for every resource, at `Register` and from
/// `GetDevicePluginOptions`: GetPreferredAllocation is implemented, PreStartContainer is not
/// needed.
pub const fn device_plugin_options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}
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
