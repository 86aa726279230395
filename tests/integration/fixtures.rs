//! Every policy in fixtures/policies is accepted or rejected exactly as its header
//! comment says, and every shipped YAML in config/ is valid and uses real GPU models and the
//! MIG profiles those models offer.

use slicelet::inventory::simulated;
use slicelet::plan;
use slicelet::policy;

use crate::common::*;

/// Header verdict: ("accept" | "reject", the path the error must name, if any).
fn header(text: &str) -> (String, Option<String>) {
    let comments: Vec<&str> = text.lines().take_while(|l| l.starts_with('#')).collect();
    let joined = comments.join(" ");
    let verdict = if joined.contains("# reject") {
        "reject"
    } else if joined.contains("# accept") {
        "accept"
    } else {
        "?"
    };
    let must = joined.split("The error must name ").nth(1).map(|rest| {
        rest.split_whitespace()
            .next()
            .unwrap()
            .trim_end_matches('.')
            .to_string()
    });
    (verdict.to_string(), must)
}

#[test]
fn fixture_policies_are_judged_as_their_headers_say() {
    let dir = fixture("policies");
    let mut seen = 0;
    let node = shipped_node("h100-80gb-x8.yaml");
    let mig_node = shipped_node("h100-80gb-x8-mig-mixed.yaml");
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        let text = read(&path);
        let (verdict, must) = header(&text);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let result = policy::parse(&text);
        match verdict.as_str() {
            "reject" => {
                let e = result.expect_err(&name);
                if let Some(p) = must {
                    assert!(
                        e.to_string().contains(&p),
                        "{name}: error must name {p}: {e}"
                    );
                    assert_eq!(e.path, p, "{name}");
                }
            }
            "accept" => {
                let p = result.unwrap_or_else(|e| panic!("{name}: {e}"));
                // "accept (MIG-capable node)" is judged on the mixed MIG H100 node; every
                // accepted file must also plan on both nodes (one ConfigMap, mixed fleet).
                let on_mig = text.contains("accept (MIG-capable node)");
                for n in [&node, &mig_node] {
                    let built = plan::build(&p, n).unwrap_or_else(|e| panic!("{name}: {e}"));
                    assert!(!built.plan.resources.is_empty(), "{name}");
                }
                if on_mig {
                    check_mig_mixed_ts(&name, &p, &mig_node);
                }
                // MPS files plan MPS resources (one control daemon per GPU).
                let built = plan::build(&p, &node).unwrap_or_else(|e| panic!("{name}: {e}"));
                let mps = built
                    .plan
                    .resources
                    .values()
                    .any(|r| r.strategy == plan::Strategy::Mps);
                assert_eq!(mps, !p.mps.resources.is_empty(), "{name}");
            }
            other => panic!("{name}: header has no accept/reject verdict ({other})"),
        }
        seen += 1;
    }
    assert!(seen >= 9, "only {seen} fixtures found in {}", dir.display());
}

fn shipped_node(name: &str) -> slicelet::inventory::Inventory {
    let path = node_file(name);
    simulated::parse(&path, &read(&path)).unwrap()
}

/// mig-mixed-ts.yaml on the mixed H100 node: one resource per MIG profile, the 1g.10gb slices
/// time-sliced 2 ways as MIG-<uuid>::0 and ::1.
fn check_mig_mixed_ts(name: &str, p: &policy::Policy, node: &slicelet::inventory::Inventory) {
    let built = plan::build(p, node).unwrap();
    let counts: Vec<(&str, usize)> = built
        .plan
        .resources
        .iter()
        .map(|(n, r)| (n.as_str(), r.devices.len()))
        .collect();
    assert_eq!(
        counts,
        [
            ("nvidia.com/gpu", 5),
            ("nvidia.com/mig-1g.10gb", 16),
            ("nvidia.com/mig-2g.20gb", 3),
            ("nvidia.com/mig-3g.40gb", 2),
        ],
        "{name}"
    );
    let small = &built.plan.resources["nvidia.com/mig-1g.10gb"];
    assert_eq!(small.strategy, plan::Strategy::TimeSlicing, "{name}");
    for pair in small.devices.chunks(2) {
        let uuid = &pair[0].gpu_uuid;
        assert!(uuid.starts_with("MIG-"), "{name}: {uuid}");
        assert_eq!(pair[0].id, format!("{uuid}::0"), "{name}");
        assert_eq!(pair[1].id, format!("{uuid}::1"), "{name}");
    }
}

#[test]
fn shipped_policy_and_nodes_are_valid_and_use_real_models() {
    let models: serde_json::Value = {
        let text = read_fixture("models/gpu-models.yaml");
        yaml_to_json(&text)
    };
    let known: Vec<(String, u64)> = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["memoryMiB"].as_u64().unwrap(),
            )
        })
        .collect();
    let p = policy::load(&repo().join("config/policy.yaml")).unwrap();
    for entry in std::fs::read_dir(repo().join("config/nodes")).unwrap() {
        let path = entry.unwrap().path();
        let inv = simulated::parse(&path, &read(&path)).unwrap();
        assert!(!inv.gpus.is_empty());
        for g in &inv.gpus {
            assert!(
                known.contains(&(g.model.clone(), g.memory_mib)),
                "{}: {} {} MiB is not in gpu-models.yaml",
                path.display(),
                g.model,
                g.memory_mib
            );
        }
        // The example policy has migStrategy none: MIG-enabled GPUs are shared whole too.
        let built = plan::build(&p, &inv).unwrap();
        assert_eq!(
            built.plan.resources["nvidia.com/gpu-shared"].devices.len(),
            inv.gpus.len() * 4
        );
    }
}

#[test]
fn shipped_mig_layouts_use_the_profiles_each_model_offers() {
    let text = read_fixture("models/gpu-models.yaml");
    let models = yaml_to_json(&text);
    let mut mig_gpus = 0;
    for entry in std::fs::read_dir(repo().join("config/nodes")).unwrap() {
        let path = entry.unwrap().path();
        let inv = simulated::parse(&path, &read(&path)).unwrap();
        for g in inv.gpus.iter().filter(|g| g.mig_enabled) {
            mig_gpus += 1;
            let at = format!("{} GPU {} ({})", path.display(), g.index, g.model);
            let model = models["models"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == g.model.as_str())
                .unwrap_or_else(|| panic!("{at}: model not in gpu-models.yaml"));
            let offered = model["mig"]
                .as_object()
                .unwrap_or_else(|| panic!("{at}: this model has no MIG"));
            let mut per_profile: std::collections::BTreeMap<&str, u64> = Default::default();
            for m in &g.mig_devices {
                *per_profile.entry(m.profile.as_str()).or_default() += 1;
            }
            for (profile, count) in per_profile {
                let max = offered
                    .get(profile)
                    .and_then(|v| v.as_u64())
                    .unwrap_or_else(|| {
                        panic!("{at}: {profile} is not a profile this model offers")
                    });
                assert!(
                    count <= max,
                    "{at}: {count}x {profile}, the model fits {max}"
                );
            }
            let slices: u32 = g.mig_devices.iter().map(|m| m.gpu_slices).sum();
            assert!(slices <= 7, "{at}: {slices} GPU slices");
        }
    }
    assert!(
        mig_gpus >= 3 + 8,
        "the MIG nodes are missing ({mig_gpus} MIG GPUs)"
    );
}

#[test]
fn shipped_mig_policy_plans_as_its_comment_says() {
    let p = policy::load(&repo().join("config/policy-mig.yaml")).unwrap();
    assert_eq!(p.mig_strategy, policy::MigStrategy::Mixed);
    let built = plan::build(&p, &shipped_node("h100-80gb-x8-mig-mixed.yaml")).unwrap();
    let counts: Vec<(&str, usize)> = built
        .plan
        .resources
        .iter()
        .map(|(n, r)| (n.as_str(), r.devices.len()))
        .collect();
    assert_eq!(
        counts,
        [
            ("nvidia.com/gpu", 5),
            ("nvidia.com/mig-1g.10gb", 16),
            ("nvidia.com/mig-2g.20gb", 3),
            ("nvidia.com/mig-3g.40gb", 2),
        ]
    );
    assert!(built.warnings.is_empty(), "{:?}", built.warnings);
    // On a node without MIG: every GPU whole, and a warning that the entry matches nothing.
    let built = plan::build(&p, &shipped_node("h100-80gb-x8.yaml")).unwrap();
    assert_eq!(built.plan.resources["nvidia.com/gpu"].devices.len(), 8);
    assert_eq!(built.warnings.len(), 1, "{:?}", built.warnings);
    // On the uniform A100 node its 1g.5gb slices are advertised, and nothing is shared.
    let built = plan::build(&p, &shipped_node("a100-40gb-x8-mig-single.yaml")).unwrap();
    assert_eq!(
        built.plan.resources["nvidia.com/mig-1g.5gb"].devices.len(),
        56
    );
}

fn yaml_to_json(text: &str) -> serde_json::Value {
    yaml_serde::from_str(text).unwrap()
}

/// The keys of the YAML blocks in docs/simulated-nodes.md's "The node file" section: every
/// `key:` at any depth (list items' `- key:` too).
fn documented_node_keys() -> std::collections::BTreeSet<String> {
    let doc = read(&repo().join("docs/simulated-nodes.md"));
    let section = doc
        .split("\n## The node file\n")
        .nth(1)
        .expect("docs/simulated-nodes.md has a section \"The node file\"");
    let section = section.split("\n## ").next().unwrap();
    let mut keys = std::collections::BTreeSet::new();
    let mut in_yaml = false;
    for line in section.lines() {
        if line.starts_with("```") {
            in_yaml = line == "```yaml";
            continue;
        }
        if !in_yaml {
            continue;
        }
        let item = line.trim_start().trim_start_matches("- ");
        if let Some((key, _)) = item.split_once(':') {
            if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric()) {
                keys.insert(key.to_string());
            }
        }
    }
    keys
}

/// docs/simulated-nodes.md shows every key a node file may have: for each level of the file
/// (the node, a GPU, a process, a memory limit, MIG, a MIG device, a link) the parser's own
/// list of the keys it expects (its unknown-key error names them) is in the documented blocks.
#[test]
fn simulated_nodes_doc_shows_every_node_file_key() {
    let documented = documented_node_keys();
    let gpu = "gpus:\n  - model: X\n    memoryMiB: 1\n";
    let probes = [
        ("the node", format!("{gpu}bogusKey: 1\n")),
        ("a GPU", format!("{gpu}    bogusKey: 1\n")),
        (
            "a process",
            format!("{gpu}    processes:\n      - pid: 1\n        bogusKey: 1\n"),
        ),
        (
            "a memory limit",
            format!("{gpu}    memoryLimits:\n      - cgroup: /a\n        hardMiB: 1\n        bogusKey: 1\n"),
        ),
        ("MIG", format!("{gpu}    mig:\n      bogusKey: 1\n")),
        (
            "a MIG device",
            format!("{gpu}    mig:\n      devices:\n        - profile: 1g.10gb\n          bogusKey: 1\n"),
        ),
        (
            "a link",
            format!("{gpu}{}links:\n  - gpus: [0, 1]\n    bogusKey: 1\n", &gpu[6..]),
        ),
    ];
    for (level, text) in probes {
        let e = simulated::parse(std::path::Path::new("n.yaml"), &text)
            .expect_err(level)
            .to_string();
        let expected = e
            .split("expected one of ")
            .nth(1)
            .or_else(|| e.split("expected ").nth(1))
            .unwrap_or_else(|| panic!("{level}: the error lists no expected keys: {e}"));
        let keys: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        assert!(!keys.is_empty(), "{level}: no keys read from {e}");
        for key in keys {
            assert!(
                documented.contains(key),
                "docs/simulated-nodes.md \"The node file\" does not show `{key}` of {level} \
                 (documented: {documented:?})"
            );
        }
    }
}
