//! What a platform team applies for GPU use and autoscaling (manifests/examples/: the
//! PodMonitor, the KEDA ScaledObject, the Grafana dashboard) uses only metrics slicelet
//! registers and docs/gpu-use.md documents, and says what it promises: scale to zero woken by a
//! non-slicelet signal, a dashboard whose every panel queries, a PodMonitor that finds the
//! DaemonSet's pods and keeps the workload's labels. Schema validation of the Kubernetes
//! objects runs in .ci/run (kubernetes-validate has no schema for the CRDs: it warns and
//! passes them, which is why their structure is checked here).

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::common::*;

const EXAMPLES: &str = "manifests/examples";
/// The examples issue 13 adds; each must exist (a rename would otherwise skip its checks).
const USAGE_EXAMPLES: [&str; 3] = [
    "podmonitor.yaml",
    "keda/scaledobject.yaml",
    "grafana-dashboard.json",
];
/// The docs page with the metric table, and the section that holds it.
const DOC: &str = "docs/gpu-use.md";
const DOC_SECTION: &str = "## Metrics";

/// Every document of a YAML file, or the one of a JSON file, as JSON values.
fn documents(path: &Path) -> Vec<Value> {
    let text = read(path);
    if path.extension().is_some_and(|e| e == "json") {
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
        return vec![v];
    }
    yaml_serde::Deserializer::from_str(&text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn example(name: &str) -> Vec<Value> {
    documents(&repo().join(EXAMPLES).join(name))
}

/// The one document of `kind` in an example file.
fn one_of_kind(name: &str, kind: &str) -> Value {
    let mut found: Vec<Value> = example(name)
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "{name}: one {kind}");
    found.remove(0)
}

/// The PromQL strings of a document: every string under a key `query`, `expr` or
/// `definition` (KEDA's trigger metadata, Grafana's targets and variables).
fn promql(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                match child {
                    Value::String(s) if matches!(k.as_str(), "query" | "expr" | "definition") => {
                        out.push(s.clone());
                    }
                    _ => promql(child, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|c| promql(c, out)),
        _ => {}
    }
}

/// The `slicelet_…` metric names an expression uses: whole identifiers (`[A-Za-z0-9_:]`)
/// starting with `slicelet_`, outside quoted strings (label values).
fn slicelet_metrics(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut ident = String::new();
    let mut quote: Option<char> = None;
    for c in expr.chars().chain(std::iter::once(' ')) {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            ident.push(c);
            continue;
        }
        if ident.starts_with("slicelet_") {
            names.insert(std::mem::take(&mut ident));
        }
        ident.clear();
        if matches!(c, '"' | '\'' | '`') {
            quote = Some(c);
        }
    }
    names
}

/// Brackets of every kind close in order, outside quoted strings (a cheap PromQL typo check;
/// there is no PromQL parser among the dependencies).
fn balanced(expr: &str) -> bool {
    let mut open = Vec::new();
    let mut quote: Option<char> = None;
    for c in expr.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '(' | '{' | '[') => open.push(c),
            (None, ')') if open.pop() != Some('(') => return false,
            (None, '}') if open.pop() != Some('{') => return false,
            (None, ']') if open.pop() != Some('[') => return false,
            _ => {}
        }
    }
    open.is_empty() && quote.is_none()
}

/// The sample names a text exposition's `# TYPE <name> <type>` lines promise (what a PromQL
/// query selects): prometheus-client writes a counter's samples as `<name>_total` and an
/// info metric's as `<name>_info`; a unit is already part of the name.
fn exposed_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            panic!("a TYPE line without name and type: {line:?}");
        };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "info" => {
                names.insert(format!("{name}_info"));
            }
            "histogram" | "gaugehistogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// The metric names of the docs page's table: the first cell of each row, backquoted.
fn documented_metrics() -> BTreeSet<String> {
    let doc = read(&repo().join(DOC));
    let start = doc
        .find(&format!("\n{DOC_SECTION}\n"))
        .unwrap_or_else(|| panic!("{DOC} has no section {DOC_SECTION:?}"));
    let section = &doc[start + 1..];
    let end = section[DOC_SECTION.len()..]
        .find("\n## ")
        .map_or(section.len(), |i| i + DOC_SECTION.len());
    section[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `slicelet_"))
        .map(|rest| format!("slicelet_{}", &rest[..rest.find('`').unwrap()]))
        .collect()
}

/// The YAML and JSON files of `dir` and of its directories (the KEDA example's kustomization).
fn example_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(example_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "json") {
            files.push(path);
        }
    }
    files
}

/// Every PromQL expression of every example, by file name (relative to the examples).
fn example_queries() -> Vec<(String, Vec<String>)> {
    let dir = repo().join(EXAMPLES);
    let mut files = example_files(&dir);
    files.sort();
    for name in USAGE_EXAMPLES {
        assert!(
            files.contains(&dir.join(name)),
            "{EXAMPLES}/{name} is missing"
        );
    }
    files
        .iter()
        .map(|f| {
            let mut exprs = Vec::new();
            for doc in documents(f) {
                promql(&doc, &mut exprs);
            }
            let name = f.strip_prefix(&dir).unwrap().to_string_lossy().into_owned();
            (name, exprs)
        })
        .collect()
}

/// Every slicelet metric name the examples use, with the file using it.
fn used_metrics() -> Vec<(String, String)> {
    let mut used = Vec::new();
    for (file, exprs) in example_queries() {
        for e in &exprs {
            assert!(
                balanced(e),
                "{file}: unbalanced brackets or quotes in {e:?}"
            );
            used.extend(slicelet_metrics(e).into_iter().map(|m| (file.clone(), m)));
        }
    }
    used
}

#[test]
fn metric_names_are_found_in_promql_and_exposition() {
    // (expression, the slicelet metrics it uses)
    let cases: [(&str, &[&str]); 6] = [
        ("slicelet_draining_devices", &["slicelet_draining_devices"]),
        (
            "time() - max by (namespace) (slicelet_container_gpu_last_active_timestamp_seconds{pod=~\"a-.*\"})",
            &["slicelet_container_gpu_last_active_timestamp_seconds"],
        ),
        // Label values and other exporters' metrics are not slicelet's.
        ("up{job=\"slicelet_x\"} * on() my_slicelet_y", &[]),
        (
            "slicelet_allocation_info * on (UUID) group_left slicelet_gpu_memory_total_bytes",
            &["slicelet_allocation_info", "slicelet_gpu_memory_total_bytes"],
        ),
        ("label_values(slicelet_resource_free_devices, node)", &["slicelet_resource_free_devices"]),
        ("sum(inference_queue_depth)", &[]),
    ];
    for (expr, want) in cases {
        let got = slicelet_metrics(expr);
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want, "{expr}");
    }
    for (expr, ok) in [
        ("sum(rate(x{a=\"(\"}[5m]))", true),
        ("avg(x{a=\"b\"}", false),
        ("x{a=\"b}", false),
        ("(x]", false),
    ] {
        assert_eq!(balanced(expr), ok, "{expr}");
    }
    let exposition = "# HELP a_total x\n# TYPE slicelet_a counter\nslicelet_a_total 1\n\
                      # TYPE slicelet_b info\nslicelet_b_info{x=\"y\"} 1\n\
                      # TYPE slicelet_c_bytes gauge\n# UNIT slicelet_c_bytes bytes\n";
    assert_eq!(
        exposed_names(exposition),
        ["slicelet_a_total", "slicelet_b_info", "slicelet_c_bytes"]
            .map(String::from)
            .into()
    );
}

#[test]
fn examples_use_only_metrics_the_docs_document() {
    let documented = documented_metrics();
    // The names issue 13 fixes, each documented with its labels and unit.
    for name in [
        "slicelet_allocation_info",
        "slicelet_gpu_utilization_percent",
        "slicelet_gpu_memory_used_bytes",
        "slicelet_gpu_memory_total_bytes",
        "slicelet_container_gpu_sm_util_percent",
        "slicelet_container_gpu_memory_used_bytes",
        "slicelet_container_gpu_last_active_timestamp_seconds",
        "slicelet_resource_allocated_devices",
        "slicelet_resource_free_devices",
        "slicelet_draining_devices",
    ] {
        assert!(documented.contains(name), "{DOC} table lacks {name}");
    }
    let used = used_metrics();
    assert!(!used.is_empty(), "the examples use no slicelet metric");
    for (file, m) in &used {
        assert!(
            documented.contains(m),
            "{EXAMPLES}/{file} uses {m}, which {DOC} \"{DOC_SECTION}\" does not document"
        );
    }
}

/// The examples and docs/gpu-use.md name only series slicelet really exposes.
#[test]
fn examples_and_docs_use_only_registered_metrics() {
    // prometheus-client leaves families without series out of the exposition, so fill them
    // from a node with containers on its GPUs (the benchmark's synthetic node).
    let metrics = slicelet::status::Metrics::new();
    let (mut plan, in_use, mut samples) = slicelet::usage::report::synthetic_node(2, 4, 3);
    // Per-replica memory limits read back for one container's cgroup, for the
    // slicelet_*memory_limit* families.
    for res in plan.resources.values_mut() {
        std::sync::Arc::make_mut(res).memory = Some(slicelet::plan::memory::PlannedMemory {
            entry: "sharing.timeSlicing.resources[0]".into(),
            limits: slicelet::policy::MemoryLimits {
                hard_mib: 1024,
                soft_mib: None,
                enforce: slicelet::policy::Enforce::Required,
            },
            unenforced: Default::default(),
            name_tag: None,
        });
    }
    samples.gpus[0].memory_limits_supported = Some(true);
    samples.gpus[0].processes[0].cgroup = Some("/kubepods/pod-0/ctr".into());
    // And a MIG device, for the slicelet_mig_* families.
    samples.gpus[1]
        .mig
        .push(slicelet::inventory::sample::MigSample {
            uuid: "MIG-00000001-0000-0000-0000-000000000000".into(),
            utilization_percent: Some(5),
            memory_used_bytes: Some(1 << 30),
            memory_total_bytes: Some(10 << 30),
        });
    let mut usage = slicelet::usage::report::Usage::new();
    usage.allocation(&plan, &in_use, metrics.usage());
    usage.sampled(&samples, &plan, &in_use, metrics.usage());
    metrics.set_plan(&plan);
    metrics.policy_applied(1);
    let exposed = exposed_names(&metrics.encode());
    assert!(
        exposed.contains("slicelet_policy_generation"),
        "no TYPE lines read from the exposition: {exposed:?}"
    );
    let mut missing: BTreeSet<String> = used_metrics()
        .into_iter()
        .filter(|(_, m)| !exposed.contains(m))
        .map(|(file, m)| format!("{m} (used by {EXAMPLES}/{file})"))
        .collect();
    missing.extend(
        documented_metrics()
            .into_iter()
            .filter(|m| !exposed.contains(m))
            .map(|m| format!("{m} ({DOC} table)")),
    );
    assert!(
        missing.is_empty(),
        "not registered by slicelet::status::Metrics: {missing:#?}"
    );
}

#[test]
fn scaled_object_scales_an_inference_deployment_to_zero_woken_by_the_queue() {
    let so = one_of_kind("keda/scaledobject.yaml", "ScaledObject");
    assert_eq!(so["apiVersion"], "keda.sh/v1alpha1");
    let spec = &so["spec"];
    assert_eq!(spec["minReplicaCount"], 0, "scale to zero");
    assert!(spec["maxReplicaCount"].as_u64().is_some_and(|n| n >= 1));

    // The target is the shared-GPU Deployment of inference.yaml, in the same namespace, and the
    // kustomization's scale-target (what `kustomize edit set configmap` changes) names both.
    let target = spec["scaleTargetRef"]["name"].as_str().unwrap();
    let kustomization = one_of_kind("keda/kustomization.yaml", "Kustomization");
    let literals: Vec<&str> = kustomization["configMapGenerator"][0]["literals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(
        kustomization["configMapGenerator"][0]["name"],
        "scale-target"
    );
    assert_eq!(spec["scaleTargetRef"]["kind"], "Deployment");
    let deployment = one_of_kind("inference.yaml", "Deployment");
    assert_eq!(deployment["metadata"]["name"], target);
    let namespace = so["metadata"]["namespace"].as_str().unwrap();
    assert_eq!(deployment["metadata"]["namespace"], namespace);
    for want in [
        format!("namespace={namespace}"),
        format!("deployment={target}"),
    ] {
        assert!(
            literals.contains(&want.as_str()),
            "scale-target has {want}: {literals:?}"
        );
    }
    let limits = &deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"];
    assert!(
        limits.get("nvidia.com/gpu-shared").is_some() || limits.get("nvidia.com/gpu").is_some(),
        "the Deployment asks for a shared GPU: {limits}"
    );

    let triggers = spec["triggers"].as_array().unwrap();
    assert_eq!(triggers.len(), 2, "a GPU trigger and a queue trigger");
    let query = |t: &Value| t["metadata"]["query"].as_str().unwrap().to_string();
    assert!(triggers.iter().all(|t| t["type"] == "prometheus"));
    let (gpu, queue): (Vec<&Value>, Vec<&Value>) = triggers
        .iter()
        .partition(|t| !slicelet_metrics(&query(t)).is_empty());
    assert_eq!(
        (gpu.len(), queue.len()),
        (1, 1),
        "one slicelet trigger, one other"
    );

    // The GPU trigger: the Deployment's pods' average SM use. Each selection takes the
    // namespace's series and keeps the Deployment's pods (its name read from the pod's).
    let g = query(gpu[0]);
    let ns = format!("namespace=\"{namespace}\"");
    let pods = format!("label_replace(vector(1), \"deployment\", \"{target}\", \"\", \"\")");
    assert!(g.contains("slicelet_container_gpu_sm_util_percent{"), "{g}");
    assert_eq!(
        (g.matches(&ns).count(), g.matches(&pods).count()),
        (3, 3),
        "{g} selects {ns} and the Deployment {target} in each of its three selections"
    );
    assert!(
        g.contains("avg(") && g.contains("sum by (pod)"),
        "{g}: the average over pods of each pod's sum"
    );
    // Unknown is not idle, on the nodes the Deployment runs on only: the fallback pairs each
    // of its pods' allocations with its own node's slicelet_attribution_up (one scrape target).
    assert!(
        g.contains("and on (instance) (slicelet_attribution_up == 0)")
            && !g.contains("min(slicelet_attribution_up)"),
        "{g}: the fallback is scoped to the Deployment's nodes, not cluster-wide"
    );
    // An average is compared as it is, not divided by the replica count again.
    assert_eq!(gpu[0]["metricType"], "Value");
    // Idle time ends the GPU trigger's activity: time() - last active, bounded.
    assert!(
        g.contains("time() - max(")
            && g.contains("slicelet_container_gpu_last_active_timestamp_seconds{"),
        "{g}: scale to zero after idle seconds"
    );
    assert!(spec["cooldownPeriod"].as_u64().is_some(), "cooldownPeriod");

    // The queue trigger: not slicelet's metric (no pod, no series at zero replicas), and it
    // activates the Deployment from zero.
    let q = &queue[0];
    assert!(query(q).contains("inference_queue_depth"), "{}", query(q));
    let activation = q["metadata"]["activationThreshold"].as_str().unwrap();
    activation.parse::<f64>().unwrap();
    q["metadata"]["threshold"]
        .as_str()
        .unwrap()
        .parse::<f64>()
        .unwrap();
    // Both say why, where an operator reads it.
    let text = read(&repo().join(EXAMPLES).join("keda/scaledobject.yaml"));
    assert!(
        text.contains("Why GPU use cannot wake the Deployment at zero replicas"),
        "the comment on why GPU use cannot wake it"
    );
}

#[test]
fn dashboard_has_its_datasource_and_node_variables_and_every_panel_queries() {
    let d = &example("grafana-dashboard.json")[0];
    assert!(d["schemaVersion"].as_u64().unwrap() >= 39);
    let vars = d["templating"]["list"].as_array().unwrap();
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    let ds = var("DS_PROMETHEUS").expect("a DS_PROMETHEUS variable");
    assert_eq!(
        (&ds["type"], &ds["query"]),
        (&"datasource".into(), &"prometheus".into())
    );
    let node = var("node")
        .or_else(|| var("instance"))
        .expect("a node variable");
    assert_eq!(node["type"], "query");
    let uses_ds = |v: &Value| v["datasource"]["uid"] == "${DS_PROMETHEUS}";
    assert!(uses_ds(node));

    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut used = BTreeSet::new();
    let mut tables = BTreeSet::new();
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let title = p["title"].as_str().unwrap();
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "{title}: panel ids are unique"
        );
        assert!(
            uses_ds(p),
            "{title}: the panel's datasource is ${{DS_PROMETHEUS}}"
        );
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no target");
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "{title}: a target without expr");
            assert!(uses_ds(t), "{title}: the target's datasource");
            assert!(
                expr.contains("$node"),
                "{title}: {expr} follows the node variable"
            );
            let names = slicelet_metrics(expr);
            if p["type"] == "table" {
                tables.extend(names.iter().cloned());
            }
            used.extend(names);
        }
    }
    assert!(
        tables.contains("slicelet_allocation_info"),
        "which pods hold which replicas: a table of slicelet_allocation_info"
    );
    for m in [
        "slicelet_gpu_utilization_percent",
        "slicelet_gpu_memory_used_bytes",
        "slicelet_container_gpu_sm_util_percent",
        "slicelet_container_gpu_memory_used_bytes",
        "slicelet_container_gpu_last_active_timestamp_seconds",
        "slicelet_resource_free_devices",
        "slicelet_draining_devices",
    ] {
        assert!(used.contains(m), "no panel shows {m}");
    }
}

#[test]
fn podmonitor_selects_the_daemonset_pods_by_their_port_and_keeps_pod_labels() {
    let pm = one_of_kind("podmonitor.yaml", "PodMonitor");
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    let ds = documents(&repo().join("manifests/base/daemonset.yaml")).remove(0);
    let template = &ds["spec"]["template"];
    let pod_labels = template["metadata"]["labels"].as_object().unwrap();
    let selector = pm["spec"]["selector"]["matchLabels"].as_object().unwrap();
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(pod_labels.get(k), Some(v), "the PodMonitor selects {k}={v}");
    }
    let base = documents(&repo().join("manifests/base/kustomization.yaml")).remove(0);
    assert_eq!(pm["metadata"]["namespace"], base["namespace"]);
    assert_eq!(
        pm["spec"]["namespaceSelector"]["matchNames"],
        serde_json::json!([base["namespace"]])
    );
    let port = &template["spec"]["containers"][0]["ports"][0];
    let endpoints = pm["spec"]["podMetricsEndpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 1);
    let e = &endpoints[0];
    assert_eq!(
        e["port"], port["name"],
        "the endpoint names the DaemonSet's port"
    );
    assert_eq!(e["path"], "/metrics");
    // The workload's pod/namespace/container labels win over the target's.
    assert_eq!(e["honorLabels"], true);
    assert!(e["relabelings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["targetLabel"] == "node"
            && r["sourceLabels"] == serde_json::json!(["__meta_kubernetes_pod_node_name"])));
    // The chart's ServiceMonitor, the alternative, keeps them too.
    let sm = read(&repo().join("deployments/helm/slicelet/templates/servicemonitor.yaml"));
    assert!(
        sm.contains("honorLabels: true"),
        "the chart's ServiceMonitor honours labels"
    );
}

/// The JSON-patch operations of an overlay's DaemonSet patches.
fn daemonset_ops(overlay: &str) -> Vec<Value> {
    let k = documents(&repo().join(format!("manifests/overlays/{overlay}/kustomization.yaml")))
        .remove(0);
    let mut ops = Vec::new();
    for patch in k["patches"].as_array().unwrap() {
        if patch["target"]["kind"] == "DaemonSet" && patch["target"]["name"] == "slicelet" {
            let p: Value = yaml_serde::from_str(patch["patch"].as_str().unwrap()).unwrap();
            ops.extend(p.as_array().unwrap().iter().cloned());
        }
    }
    ops
}

#[test]
fn base_mounts_pod_resources_and_gpu_usage_overlay_mounts_host_proc_read_only() {
    // The base: the directory of pod-resources' default socket, read-only, from the host.
    let ds = documents(&repo().join("manifests/base/daemonset.yaml")).remove(0);
    let spec = &ds["spec"]["template"]["spec"];
    let socket_dir = Path::new(slicelet::api::podresources::DEFAULT_SOCKET)
        .parent()
        .unwrap()
        .to_str()
        .unwrap();
    let mounts = spec["containers"][0]["volumeMounts"].as_array().unwrap();
    let m = mounts
        .iter()
        .find(|m| m["mountPath"] == socket_dir)
        .unwrap_or_else(|| panic!("the base mounts {socket_dir}"));
    assert_eq!(m["readOnly"], true);
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == m["name"])
        .unwrap();
    assert_eq!(volume["hostPath"]["path"], socket_dir);
    assert!(spec.get("hostPID").is_none());

    // overlays/gpu-usage: host /proc read-only at <SLICELET_PROC_ROOT>/proc, no hostPID.
    let ops = daemonset_ops("gpu-usage");
    let env = |name: &str| {
        ops.iter()
            .find(|o| {
                o["path"] == "/spec/template/spec/containers/0/env/-" && o["value"]["name"] == name
            })
            .map(|o| o["value"]["value"].as_str().unwrap().to_string())
    };
    let root = env("SLICELET_PROC_ROOT").expect("SLICELET_PROC_ROOT");
    env("SLICELET_SAMPLE_SECONDS")
        .expect("SLICELET_SAMPLE_SECONDS")
        .parse::<u64>()
        .unwrap();
    let mount = ops
        .iter()
        .find(|o| o["path"] == "/spec/template/spec/containers/0/volumeMounts/-")
        .map(|o| &o["value"])
        .expect("a mount");
    assert_eq!(
        Path::new(mount["mountPath"].as_str().unwrap()),
        Path::new(&root).join("proc")
    );
    assert_eq!(mount["readOnly"], true, "the host's /proc, read-only");
    let volume = ops
        .iter()
        .find(|o| {
            o["path"] == "/spec/template/spec/volumes/-" && o["value"]["name"] == mount["name"]
        })
        .map(|o| &o["value"])
        .expect("its volume");
    assert_eq!(volume["hostPath"]["path"], "/proc");
    assert!(
        ops.iter()
            .all(|o| !o["path"].as_str().unwrap().contains("hostPID")),
        "a mount of /proc, not hostPID"
    );
}
