//! The standard topology attributes and the API server's limits on every device the builder
//! makes for the shipped nodes.

use super::*;
use crate::inventory::{simulated, test_node};
use crate::plan;
use crate::plan::dra_names::is_dns_label;
use crate::policy::parse;

fn params() -> SliceParams {
    SliceParams {
        node: "node-1".to_string(),
        driver: "gpu.slicelet.io".to_string(),
        generation: 1,
        driver_version: Some("550.54.15".to_string()),
        unhealthy: Unhealthy::default(),
    }
}

fn devices(s: &Slices) -> Vec<&Device> {
    s.slices
        .iter()
        .flat_map(|x| x.spec.devices.iter().flatten())
        .collect()
}

/// Whether `s` is a C identifier of at most 32 characters (`resource.k8s.io/v1`
/// DeviceMaxIDLength): a letter or `_`, then letters, digits and `_`.
fn is_c_identifier(s: &str) -> bool {
    let mut b = s.bytes();
    s.len() <= 32
        && b.next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Whether `name` is a qualified attribute or capacity name as the API server validates it:
/// a C identifier ([`is_c_identifier`]), optionally after a DNS subdomain of at most 63
/// characters (DeviceMaxDomainLength) and `/`.
fn is_qualified_name(name: &str) -> bool {
    match name.split_once('/') {
        None => is_c_identifier(name),
        Some((domain, id)) => {
            !domain.is_empty()
                && domain.len() <= 63
                && crate::policy::is_dns_subdomain(domain)
                && is_c_identifier(id)
        }
    }
}

#[test]
fn qualified_names() {
    for (name, want) in [
        ("uuid", true),
        ("_x9", true),
        ("resource.kubernetes.io/numaNode", true),
        ("resource.kubernetes.io/pcieRoot", true),
        ("gpu.slicelet.io/productName", true),
        (&"a".repeat(32), true),
        (&"a".repeat(33), false),
        (&format!("{}.io/x", "a".repeat(60)), true),
        (&format!("{}.io/x", "a".repeat(61)), false),
        ("9lives", false),
        ("numa-node", false),
        ("", false),
        ("/numaNode", false),
        ("Resource.Kubernetes.io/numaNode", false),
        ("a/b/c", false),
        ("resource.kubernetes.io/", false),
    ] {
        assert_eq!(is_qualified_name(name), want, "{name:?}");
    }
}

/// Every device the builder makes for every shipped node (`config/nodes/*.yaml`), whole, time-
/// sliced, MPS and MIG, with a driver version and a PCIe root on every GPU (the most
/// attributes a device gets): at most 32 attributes and capacities, every name a valid
/// qualified name, every string value within 64 characters, and the standard topology
/// attributes equal to the GPU's.
#[test]
fn every_device_of_the_shipped_nodes_stays_within_the_api_limits() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/nodes");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    let mut checked = 0;
    for path in files {
        let mut inv = simulated::parse(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
        for (i, g) in inv.gpus.iter_mut().enumerate() {
            g.pcie_root = Some(format!("pci0000:{:02x}", i / 2));
        }
        let profiles: std::collections::BTreeSet<String> = inv
            .gpus
            .iter()
            .flat_map(|g| &g.mig_devices)
            .map(|m| format!("nvidia.com/mig-{}", m.profile))
            .collect();
        let mixed = format!(
            "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  resources: [{}]\n",
            profiles.iter().cloned().collect::<Vec<_>>().join(", ")
        );
        let policies = [
            "version: v1\n".to_string(),
            format!("{mixed}sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n"),
            format!("{mixed}sharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n"),
        ];
        for policy in &policies {
            let Ok(built) = plan::build(&parse(policy).unwrap(), &inv) else {
                // A shape the node cannot take (MPS on MIG GPUs, say); the others cover it.
                continue;
            };
            let s = build(
                built.plan.resources.values().map(|r| &**r),
                &inv,
                &params(),
                &HealthMap::new(),
            );
            // Counter sets, counters and device names are lowercase RFC 1123 labels
            // (`pkg/apis/resource/validation`: a 1.36 API server refused `computeSlices`).
            for set in s
                .slices
                .iter()
                .flat_map(|x| x.spec.shared_counters.iter().flatten())
            {
                assert!(is_dns_label(&set.name), "{}: {policy}", set.name);
                for c in set.counters.keys() {
                    assert!(is_dns_label(c), "counter {c}: {policy}");
                }
            }
            for d in devices(&s) {
                assert!(is_dns_label(&d.name), "device {}: {policy}", d.name);
                for cc in d.consumes_counters.iter().flatten() {
                    assert!(
                        is_dns_label(&cc.counter_set),
                        "{}: {policy}",
                        cc.counter_set
                    );
                    for c in cc.counters.keys() {
                        assert!(is_dns_label(c), "consumed counter {c}: {policy}");
                    }
                }
                let what = format!("{} {}: {policy}", path.display(), d.name);
                let attrs = d.attributes.as_ref().unwrap();
                let n = attrs.len() + d.capacity.as_ref().map_or(0, BTreeMap::len);
                assert!(n <= MAX_ATTRIBUTES_AND_CAPACITIES, "{n}: {what}");
                for (name, v) in attrs {
                    assert!(is_qualified_name(name), "{name}: {what}");
                    assert!(
                        v.string
                            .as_ref()
                            .is_none_or(|s| s.chars().count() <= MAX_STRING_ATTRIBUTE),
                        "{name}: {what}"
                    );
                }
                for name in d.capacity.iter().flat_map(|c| c.keys()) {
                    assert!(is_qualified_name(name), "{name}: {what}");
                }
                let index = attrs["index"].int.unwrap();
                let g = inv.by_index(u32::try_from(index).unwrap()).unwrap();
                assert_eq!(
                    attrs.get(NUMA_NODE_ATTRIBUTE).and_then(|a| a.int),
                    g.numa_node,
                    "{what}"
                );
                assert_eq!(
                    attrs
                        .get(PCIE_ROOT_ATTRIBUTE)
                        .and_then(|a| a.string.as_deref()),
                    g.pcie_root.as_deref(),
                    "{what}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 500, "{checked} devices checked");
}

/// A device with an unknown NUMA node or PCIe root has no such attribute; a known one is the
/// GPU's, also on its MIG devices and replicas.
#[test]
fn topology_attributes_only_where_known() {
    let mut inv = test_node(2);
    inv.gpus[0].pcie_root = Some("pci0000:16".to_string());
    inv.gpus[1].numa_node = None;
    let built = plan::build(
        &parse("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n").unwrap(),
        &inv,
    )
    .unwrap();
    let s = build(
        built.plan.resources.values().map(|r| &**r),
        &inv,
        &params(),
        &HealthMap::new(),
    );
    let topo: Vec<(String, Option<i64>, Option<String>)> = devices(&s)
        .iter()
        .map(|d| {
            let a = d.attributes.as_ref().unwrap();
            (
                d.name.clone(),
                a.get(NUMA_NODE_ATTRIBUTE).and_then(|v| v.int),
                a.get(PCIE_ROOT_ATTRIBUTE).and_then(|v| v.string.clone()),
            )
        })
        .collect();
    let root = Some("pci0000:16".to_string());
    let name = |g: usize, n: u32| device_name(&format!("{}::{n}", inv.gpus[g].uuid));
    assert_eq!(
        topo,
        [
            (name(0, 0), Some(0), root.clone()),
            (name(0, 1), Some(0), root),
            (name(1, 0), None, None),
            (name(1, 1), None, None),
        ]
    );
}
