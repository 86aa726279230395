use super::*;
use crate::inventory::simulated;
use crate::plan::build;
use crate::policy::parse;

const R615: &str = include_str!("../../../config/nodes/h100-80gb-x8-r615.yaml");
const POLICY: &str = include_str!("../../../config/policy-memory.yaml");

fn plan(policy: &str) -> Plan {
    let inv = simulated::parse(Path::new("node.yaml"), R615).unwrap();
    build(&parse(policy).unwrap(), &inv).unwrap().plan
}

#[test]
fn one_device_per_resource_unit_and_replica_count_with_its_hook() {
    let p = plan(POLICY);
    let hook = HookConfig {
        nvml_library: Some(PathBuf::from("/opt/nvml/libnvidia-ml.so.1")),
        env: vec!["LD_LIBRARY_PATH=/opt/nvml".into()],
        ..HookConfig::default()
    };
    let text = spec(&p, &hook).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["kind"], KIND);
    let gpu0 = &p.resources["nvidia.com/gpu-20gb"].devices[0].gpu_uuid;
    let names: Vec<&str> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            format!("{gpu0}-20480mib-x1"),
            format!("{gpu0}-20480mib-x2"),
            format!("{gpu0}-38912mib-x1"),
        ]
    );
    for n in &names {
        crate::policy::cdi::check_device_name(n).unwrap();
    }
    let two = &v["devices"][1]["containerEdits"];
    assert_eq!(two["env"][0], "SLICELET_GPU_MEMORY_LIMIT_MIB=40960");
    let h = &two["hooks"][0];
    assert_eq!(h["hookName"], "createContainer");
    // The runtime's bound on the hook, past the hook's own deadline.
    assert_eq!(h["timeout"], HOOK_TIMEOUT_SECONDS);
    assert!(
        u64::from(HOOK_TIMEOUT_SECONDS) > crate::hook::DEFAULT_DEADLINE.as_secs(),
        "the watchdog must end a best-effort hook before the runtime kills it"
    );
    assert_eq!(h["path"], DEFAULT_HOOK_BINARY);
    let args: Vec<&str> = h["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            DEFAULT_HOOK_BINARY,
            "hook",
            "set-memory-limits",
            "--gpu",
            gpu0,
            "--hard-mib",
            "40960",
            "--soft-mib",
            "0",
            "--enforce",
            "required",
            "--nvml-library",
            "/opt/nvml/libnvidia-ml.so.1",
        ]
    );
    assert_eq!(h["env"][0], "LD_LIBRARY_PATH=/opt/nvml");
    // The names Allocate returns are the spec's.
    let res = &p.resources["nvidia.com/gpu-38gb"];
    assert_eq!(
        qualified_name(res, &res.devices[0], 1).unwrap(),
        format!("{KIND}={gpu0}-38912mib-x1")
    );
}

#[test]
fn no_limits_no_spec_and_unenforced_units_get_no_device() {
    assert!(spec(&plan("version: v1\n"), &HookConfig::default()).is_none());
    let mut inv = simulated::parse(Path::new("node.yaml"), R615).unwrap();
    inv.cgroup_v2 = false;
    let only = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-20gb\n        devices: [0]\n        replicas: 2\n        memory: {hard: 20Gi, enforce: best-effort}\n";
    let p = build(&parse(only).unwrap(), &inv).unwrap().plan;
    assert!(spec(&p, &HookConfig::default()).is_none());
    let res = &p.resources["nvidia.com/gpu-20gb"];
    assert!(qualified_name(res, &res.devices[0], 1).is_none());
}

#[test]
fn allocate_names_the_toolkit_gpu_and_the_memory_device_for_the_replicas_asked() {
    let p = plan(POLICY);
    let res = &p.resources["nvidia.com/gpu-20gb"];
    let ids: Vec<String> = res.devices.iter().map(|d| d.id.clone()).collect();
    let gpu0 = &res.devices[0].gpu_uuid;
    let one = crate::allocate::allocate(res, &ids[..1], "/").unwrap();
    assert_eq!(
        one.cdi_devices,
        [
            format!("nvidia.com/gpu={gpu0}"),
            format!("{KIND}={gpu0}-20480mib-x1")
        ]
    );
    let both = crate::allocate::allocate(res, &ids, "/").unwrap();
    assert_eq!(both.cdi_devices[1], format!("{KIND}={gpu0}-20480mib-x2"));
    // Whole GPUs of the same plan: no memory device.
    let whole = &p.resources["nvidia.com/gpu"];
    let a = crate::allocate::allocate(whole, &[whole.devices[0].id.clone()], "/").unwrap();
    assert_eq!(a.cdi_devices.len(), 1);
}

/// Two memory-limited resources of one GPU with the same size (`nvidia.com/gpu-a` and
/// `nvidia.com/gpu-b`, 10 GiB each) gave their devices the same names: the spec listed each
/// twice (runtimes refuse such a spec whole), and a container given one of each would get the
/// name once from the kubelet (one hook for two replicas). Their names now carry the
/// resource; a size no other resource of the GPU has keeps its name.
#[test]
fn two_resources_of_one_size_on_one_gpu_get_names_of_their_own() {
    let policy = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-a\n        devices: [0]\n        replicas: 2\n        memory: {hard: 10Gi}\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-b\n        devices: [0]\n        replicas: 2\n        memory: {hard: 10Gi}\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-20gb\n        devices: [0]\n        replicas: 1\n        memory: {hard: 20Gi}\n";
    let p = plan(policy);
    let text = spec(&p, &HookConfig::default()).unwrap();
    let parsed = crate::cdi::parse_spec(Path::new(SPEC_FILE), &text).unwrap();
    let gpu0 = p.resources["nvidia.com/gpu-a"].devices[0].gpu_uuid.clone();
    let name = |resource: &str, count: u32| {
        let res = &p.resources[resource];
        qualified_name(res, &res.devices[0], count).unwrap()
    };
    let (a, b) = (name("nvidia.com/gpu-a", 1), name("nvidia.com/gpu-b", 1));
    assert_ne!(a, b);
    assert_eq!(a, format!("{KIND}={gpu0}-10240mib-x1-nvidia.com_gpu-a"));
    assert_eq!(
        name("nvidia.com/gpu-20gb", 1),
        format!("{KIND}={gpu0}-20480mib-x1")
    );
    for n in [a, b, name("nvidia.com/gpu-b", 2)] {
        let bare = n.strip_prefix(&format!("{KIND}=")).unwrap();
        assert!(
            parsed.devices.iter().any(|d| d == bare),
            "{bare} not in the spec"
        );
    }
    assert_eq!(parsed.devices.len(), 5);
}
