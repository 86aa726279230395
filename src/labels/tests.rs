use super::*;
use crate::inventory::{simulated, test_node};
use crate::plan;
use crate::policy::parse;

const A100_X8: &str = include_str!("../../config/nodes/a100-40gb-x8.yaml");
const H100_X8: &str = include_str!("../../config/nodes/h100-80gb-x8.yaml");
const H100_MIG_MIXED: &str = include_str!("../../config/nodes/h100-80gb-x8-mig-mixed.yaml");
const A100_MIG_SINGLE: &str = include_str!("../../config/nodes/a100-40gb-x8-mig-single.yaml");

/// The labels of `policy` planned on the simulated node `node` (YAML text).
fn labels_of(policy: &str, node: &str) -> NodeLabels {
    let policy = parse(policy).unwrap();
    let inv = simulated::parse(std::path::Path::new("node.yaml"), node).unwrap();
    let built = plan::build(&policy, &inv).unwrap();
    node_labels(&built.plan, &inv, policy.mig_strategy)
}

/// The feature file of `policy` on `node`, checked for label grammar and no warnings.
fn file_of(policy: &str, node: &str) -> String {
    let got = labels_of(policy, node);
    assert_eq!(got.warnings, Vec::<String>::new());
    assert_grammar(&got.labels);
    render(&got.labels)
}

fn assert_grammar(labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        let (prefix, name) = k.split_once('/').expect("every key has a prefix");
        assert!(!prefix.is_empty() && name.len() <= MAX_LABEL_NAME, "{k}");
        assert!(is_label_value(v), "{k}={v}");
    }
}

fn expect(lines: &[&str]) -> String {
    let mut s = format!("{HEADER}\n");
    for l in lines {
        s.push_str(l);
        s.push('\n');
    }
    s
}

#[test]
fn whole_gpus() {
    assert_eq!(
        file_of("version: v1\n", A100_X8),
        expect(&[
            "nvidia.com/gpu.count=8",
            "nvidia.com/gpu.memory=40960",
            "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu.replicas=1",
            "nvidia.com/gpu.sharing-strategy=none",
        ])
    );
}

#[test]
fn time_sliced_in_place_is_shared_as_gfd_names_it() {
    let policy = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n";
    assert_eq!(
        file_of(policy, A100_X8),
        expect(&[
            "nvidia.com/gpu.count=8",
            "nvidia.com/gpu.memory=40960",
            "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-SHARED",
            "nvidia.com/gpu.replicas=4",
            "nvidia.com/gpu.sharing-strategy=time-slicing",
        ])
    );
}

#[test]
fn renamed_whole_node_gets_its_own_keys_without_shared_suffix() {
    // config/policy.yaml: every GPU 4 ways as nvidia.com/gpu-shared; nvidia.com/gpu is not
    // served, so it gets no keys.
    assert_eq!(
        file_of(include_str!("../../config/policy.yaml"), H100_X8),
        expect(&[
            "nvidia.com/gpu-shared.count=8",
            "nvidia.com/gpu-shared.memory=81559",
            "nvidia.com/gpu-shared.product=NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu-shared.replicas=4",
            "nvidia.com/gpu-shared.sharing-strategy=time-slicing",
        ])
    );
}

#[test]
fn per_gpu_entry_counts_only_the_gpus_it_is_built_on() {
    // The example: devices [0] renamed, 4 replicas, on 8 GPUs.
    let policy = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0]\n        replicas: 4\n";
    assert_eq!(
        file_of(policy, A100_X8),
        expect(&[
            "nvidia.com/gpu-shared.count=1",
            "nvidia.com/gpu-shared.memory=40960",
            "nvidia.com/gpu-shared.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu-shared.replicas=4",
            "nvidia.com/gpu-shared.sharing-strategy=time-slicing",
            "nvidia.com/gpu.count=7",
            "nvidia.com/gpu.memory=40960",
            "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu.replicas=1",
            "nvidia.com/gpu.sharing-strategy=none",
        ])
    );
}

#[test]
fn two_per_gpu_entries_fixture() {
    // fixtures/policies/ts-per-gpu.yaml: GPUs 0,1 8 ways as gpu-small, 2,3 2 ways as
    // gpu-medium, 4-7 whole.
    assert_eq!(
        file_of(
            include_str!("../../fixtures/policies/ts-per-gpu.yaml"),
            A100_X8
        ),
        expect(&[
            "nvidia.com/gpu-medium.count=2",
            "nvidia.com/gpu-medium.memory=40960",
            "nvidia.com/gpu-medium.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu-medium.replicas=2",
            "nvidia.com/gpu-medium.sharing-strategy=time-slicing",
            "nvidia.com/gpu-small.count=2",
            "nvidia.com/gpu-small.memory=40960",
            "nvidia.com/gpu-small.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu-small.replicas=8",
            "nvidia.com/gpu-small.sharing-strategy=time-slicing",
            "nvidia.com/gpu.count=4",
            "nvidia.com/gpu.memory=40960",
            "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu.replicas=1",
            "nvidia.com/gpu.sharing-strategy=none",
        ])
    );
}

#[test]
fn rename_by_default_fixture() {
    // fixtures/policies/ts-rename-by-default.yaml: 10 replicas as nvidia.com/gpu.shared.
    assert_eq!(
        file_of(
            include_str!("../../fixtures/policies/ts-rename-by-default.yaml"),
            A100_X8
        ),
        expect(&[
            "nvidia.com/gpu.shared.count=8",
            "nvidia.com/gpu.shared.memory=40960",
            "nvidia.com/gpu.shared.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu.shared.replicas=10",
            "nvidia.com/gpu.shared.sharing-strategy=time-slicing",
        ])
    );
}

#[test]
fn mig_mixed_labels_each_profile_and_the_whole_gpus() {
    // config/policy-mig.yaml on config/nodes/h100-80gb-x8-mig-mixed.yaml: GPU 0 7x 1g.10gb,
    // GPU 1 3x 2g.20gb + 1g.10gb, GPU 2 2x 3g.40gb, GPUs 3-7 whole; 1g.10gb time-sliced 2 ways
    // under its own name (so -SHARED, as GFD).
    assert_eq!(
        file_of(include_str!("../../config/policy-mig.yaml"), H100_MIG_MIXED),
        expect(&[
            "nvidia.com/gpu.count=5",
            "nvidia.com/gpu.memory=81559",
            "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.replicas=1",
            "nvidia.com/gpu.sharing-strategy=none",
            "nvidia.com/mig-1g.10gb.count=8",
            "nvidia.com/mig-1g.10gb.memory=10240",
            "nvidia.com/mig-1g.10gb.product=NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED",
            "nvidia.com/mig-1g.10gb.replicas=2",
            "nvidia.com/mig-1g.10gb.sharing-strategy=time-slicing",
            "nvidia.com/mig-2g.20gb.count=3",
            "nvidia.com/mig-2g.20gb.memory=20480",
            "nvidia.com/mig-2g.20gb.product=NVIDIA-H100-80GB-HBM3-MIG-2g.20gb",
            "nvidia.com/mig-2g.20gb.replicas=1",
            "nvidia.com/mig-2g.20gb.sharing-strategy=none",
            "nvidia.com/mig-3g.40gb.count=2",
            "nvidia.com/mig-3g.40gb.memory=40960",
            "nvidia.com/mig-3g.40gb.product=NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
            "nvidia.com/mig-3g.40gb.replicas=1",
            "nvidia.com/mig-3g.40gb.sharing-strategy=none",
            "nvidia.com/mig.strategy=mixed",
        ])
    );
}

#[test]
fn mig_single_labels_the_mig_devices_as_gpus() {
    let policy = "version: v1\nflags:\n  migStrategy: single\n";
    assert_eq!(
        file_of(policy, A100_MIG_SINGLE),
        expect(&[
            "nvidia.com/gpu.count=56",
            "nvidia.com/gpu.memory=5120",
            "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
            "nvidia.com/gpu.replicas=1",
            "nvidia.com/gpu.sharing-strategy=none",
            "nvidia.com/mig.strategy=single",
        ])
    );
}

#[test]
fn mps_fixture() {
    // fixtures/policies/mps-equal.yaml: every GPU 4 MPS clients as nvidia.com/gpu-mps.
    assert_eq!(
        file_of(
            include_str!("../../fixtures/policies/mps-equal.yaml"),
            A100_X8
        ),
        expect(&[
            "nvidia.com/gpu-mps.count=8",
            "nvidia.com/gpu-mps.memory=40960",
            "nvidia.com/gpu-mps.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu-mps.replicas=4",
            "nvidia.com/gpu-mps.sharing-strategy=mps",
        ])
    );
}

#[test]
fn mps_in_place_is_shared() {
    let policy = "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n";
    let got = labels_of(policy, A100_X8).labels;
    assert_eq!(
        got["nvidia.com/gpu.product"],
        "NVIDIA-A100-SXM4-40GB-SHARED"
    );
    assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "mps");
}

#[test]
fn a_renamed_single_replica_is_not_shared() {
    let policy = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: whole\n        devices: 2\n        replicas: 1\n";
    let got = labels_of(policy, A100_X8).labels;
    assert_eq!(got["nvidia.com/whole.count"], "2");
    assert_eq!(got["nvidia.com/whole.replicas"], "1");
    assert_eq!(got["nvidia.com/whole.sharing-strategy"], "none");
    assert_eq!(got["nvidia.com/gpu.count"], "6");
}

#[test]
fn no_resources_no_labels() {
    let got = node_labels(&Plan::default(), &Inventory::default(), MigStrategy::Mixed);
    assert_eq!(got, NodeLabels::default());
    assert_eq!(render(&got.labels), format!("{HEADER}\n"));
    assert!(
        !HEADER.starts_with("# +"),
        "a `# +` line is an NFD directive, not a comment"
    );
}

#[test]
fn odd_product_names_become_valid_label_values() {
    let mut node = test_node(1);
    node.gpus[0].model =
        "NVIDIA  H100 (PCIe)/rev+2 Ä very long product name that keeps going on and on".into();
    let policy = parse("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n").unwrap();
    let built = plan::build(&policy, &node).unwrap();
    let got = node_labels(&built.plan, &node, policy.mig_strategy);
    let product = &got.labels["nvidia.com/gpu.product"];
    assert_eq!(
        product,
        "NVIDIA-H100-PCIerev2-very-long-product-name-that-keeps-g-SHARED"
    );
    assert!(product.len() <= MAX_LABEL_VALUE);
    assert_grammar(&got.labels);
}

#[test]
fn label_value_grammar() {
    let cases = [
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("  Tesla   T4 ", "Tesla-T4"),
        ("GeForce RTX 4090 (Ti)/x", "GeForce-RTX-4090-Tix"),
        ("-_.abc.-_", "abc"),
        ("++", ""),
        ("", ""),
    ];
    for (raw, want) in cases {
        assert_eq!(label_value(raw), want, "{raw:?}");
        assert!(is_label_value(want));
    }
    assert_eq!(label_value(&"a".repeat(100)), "a".repeat(63));
    // Cut at 63, then trimmed: no trailing '-'.
    assert_eq!(
        label_value(&format!("{}-b", "a".repeat(62))),
        "a".repeat(62)
    );
    for bad in ["-a", "a-", "a b", "a/b", &"a".repeat(64)] {
        assert!(!is_label_value(bad), "{bad:?}");
    }
}

#[test]
fn a_resource_of_mixed_models_is_described_by_its_smallest_device() {
    let mut node = test_node(3);
    node.gpus[1].model = "NVIDIA L4".into();
    node.gpus[1].memory_mib = 23034;
    let built = plan::build(&parse("version: v1\n").unwrap(), &node).unwrap();
    let got = node_labels(&built.plan, &node, MigStrategy::None);
    assert_eq!(got.labels["nvidia.com/gpu.count"], "3");
    assert_eq!(got.labels["nvidia.com/gpu.product"], "NVIDIA-L4");
    assert_eq!(got.labels["nvidia.com/gpu.memory"], "23034");
    assert_eq!(got.warnings.len(), 1, "{:?}", got.warnings);
    assert!(
        got.warnings[0].contains("NVIDIA H100 80GB HBM3 81559 MiB, NVIDIA L4 23034 MiB")
            && got.warnings[0].contains("GPU 1"),
        "{}",
        got.warnings[0]
    );
}

#[test]
fn keys_too_long_for_kubernetes_are_left_out_with_a_warning() {
    let long = "a".repeat(60);
    let policy = parse(&format!("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: {long}\n        devices: [0]\n        replicas: 2\n")).unwrap();
    let node = test_node(2);
    let built = plan::build(&policy, &node).unwrap();
    let got = node_labels(&built.plan, &node, MigStrategy::None);
    // `<60 a>.count` is 66 characters: every key of that resource is over the limit.
    assert!(
        got.labels.keys().all(|k| k.starts_with("nvidia.com/gpu.")),
        "{:?}",
        got.labels
    );
    assert_eq!(got.warnings.len(), 5, "{:?}", got.warnings);
    assert!(got.warnings[0].contains(&format!("nvidia.com/{long}.count")));
    assert_grammar(&got.labels);
}

mod proptests {
    use super::super::{is_label_value, label_value};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_label_value_is_valid(raw in "\\PC{0,100}") {
            let v = label_value(&raw);
            prop_assert!(is_label_value(&v), "{raw:?} -> {v:?}");
        }
    }
}

#[test]
fn mig_single_time_sliced_in_place_is_shared() {
    // Under `single` the MIG devices are `nvidia.com/gpu`: sharing that name in place is
    // sharing, not a rename, so the product carries -SHARED.
    let policy = "version: v1\nflags:\n  migStrategy: single\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n";
    let got = labels_of(policy, A100_MIG_SINGLE).labels;
    assert_eq!(
        got["nvidia.com/gpu.product"],
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    );
    assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "time-slicing");
}

#[test]
fn one_replica_in_place_is_not_shared() {
    let policy = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 1\n";
    let got = labels_of(policy, A100_X8).labels;
    assert_eq!(got["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-40GB");
    assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "none");
}

#[test]
fn a_resource_differing_in_model_or_memory_alone_warns() {
    for (model, memory) in [("NVIDIA H100 PCIe", None), ("", Some(40960))] {
        let mut node = test_node(2);
        if !model.is_empty() {
            node.gpus[1].model = model.into();
        }
        if let Some(m) = memory {
            node.gpus[1].memory_mib = m;
        }
        let built = plan::build(&parse("version: v1\n").unwrap(), &node).unwrap();
        let got = node_labels(&built.plan, &node, MigStrategy::None);
        assert_eq!(
            got.warnings.len(),
            1,
            "{model:?} {memory:?}: {:?}",
            got.warnings
        );
    }
}

#[test]
fn a_gpu_of_unknown_memory_gets_no_memory_label() {
    let mut node = test_node(1);
    node.gpus[0].memory_mib = 0;
    let built = plan::build(&parse("version: v1\n").unwrap(), &node).unwrap();
    let got = node_labels(&built.plan, &node, MigStrategy::None);
    assert!(
        !got.labels.contains_key("nvidia.com/gpu.memory"),
        "{:?}",
        got.labels
    );
    assert_eq!(got.labels["nvidia.com/gpu.count"], "1");
}
