//! Node labels computed from what slicelet really advertises, in GPU Feature Discovery's key
//! names and value formats, for Node Feature Discovery's local feature file (`features.d`).
//!
//! GFD computes its sharing labels from the same policy file but discards `devices` and
//! `rename`, so with per-GPU entries it labels every GPU as shared. [`node_labels`] derives them
//! from the built plan instead: one set of keys per advertised resource, named after that
//! resource (`nvidia.com/gpu.count`, `nvidia.com/gpu-shared.replicas`,
//! `nvidia.com/mig-1g.10gb.product`):
//!
//! | key | value |
//! |---|---|
//! | `<resource>.count` | physical units (GPUs or MIG devices) the resource is built on |
//! | `<resource>.replicas` | devices advertised per unit (1 for whole devices) |
//! | `<resource>.sharing-strategy` | `mps` for MPS, `time-slicing` with more than 1 replica, else `none` |
//! | `<resource>.product` | NVML's product name, GFD-sanitised (`NVIDIA-A100-SXM4-40GB`); `-MIG-<profile>` for MIG devices; `-SHARED` when replicas > 1 and the resource keeps its node name (GFD's rule) |
//! | `<resource>.memory` | the unit's memory, MiB (a GPU's framebuffer, or a MIG device's slice) |
//! | `nvidia.com/mig.strategy` | `single` or `mixed`, absent under `none` (as GFD) |
//!
//! A resource built on GPUs of several models (or memory sizes) is described by its unit with
//! the least memory, the lowest index first, so a nodeSelector on `.memory` or `.product` never
//! promises more than some device gives; that is reported as a warning.
//!
//! Every value satisfies the Kubernetes label-value grammar (at most 63 characters of
//! `[A-Za-z0-9._-]`, alphanumeric at both ends; [`label_value`]); a key whose name part would
//! exceed 63 characters (a long renamed resource) is left out with a warning.
//!
//! [`node_labels`] and [`render`] are pure; [`file`] writes the result atomically.

pub mod file;

use std::collections::BTreeMap;

use crate::inventory::{mig, Inventory};
use crate::plan::{Plan, ResourcePlan, Strategy, VirtualDevice, WHOLE_GPU_RESOURCE};
use crate::policy::MigStrategy;

/// The longest label value Kubernetes accepts, characters.
pub const MAX_LABEL_VALUE: usize = 63;

/// The longest name part (after the `/`) of a label key Kubernetes accepts, characters.
pub const MAX_LABEL_NAME: usize = 63;

/// The key of the MIG strategy label (GFD's).
pub const MIG_STRATEGY_LABEL: &str = "nvidia.com/mig.strategy";
/// The state of the node's MIG layout (`nvidia.com/mig.config`, docs/mig.md): `pending`,
/// `success` or `failed`, NVIDIA's mig-manager's key and values. Written to the NFD feature
/// file like every other label (slicelet never writes Node objects).
pub const MIG_CONFIG_STATE_LABEL: &str = "nvidia.com/mig.config.state";

/// The first line of the feature file: an NFD comment (a `#` not followed by ` +`, which would
/// be a directive).
pub const HEADER: &str = "# slicelet: labels of the resources this node advertises; rewritten on every plan change, removed when slicelet stops";

/// The labels of a plan and what could not be labelled as asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLabels {
    /// Label key → value, ordered by key.
    pub labels: BTreeMap<String, String>,
    /// Resources of mixed models, keys left out for their length.
    pub warnings: Vec<String>,
}

/// One physical unit behind a resource, as the labels see it.
struct UnitFacts<'a> {
    gpu_index: u32,
    model: &'a str,
    memory_mib: u64,
    profile: Option<&'a str>,
}

/// The labels for everything `plan` advertises. `inventory` is the one the plan was built from
/// (only GPU models and memory are read; health does not matter), `mig_strategy` the applied
/// policy's `flags.migStrategy`.
pub fn node_labels(plan: &Plan, inventory: &Inventory, mig_strategy: MigStrategy) -> NodeLabels {
    let mut out = NodeLabels::default();
    for res in plan.resources.values() {
        resource_labels(res, inventory, mig_strategy, &mut out);
    }
    if !plan.resources.is_empty() && mig_strategy != MigStrategy::None {
        out.labels.insert(
            MIG_STRATEGY_LABEL.to_string(),
            mig_strategy.as_str().to_string(),
        );
    }
    out
}

/// The node resource a device belongs to before any sharing: what `rename` would change.
fn node_resource(d: &VirtualDevice, mig_strategy: MigStrategy) -> String {
    match &d.mig {
        Some(m) if mig_strategy == MigStrategy::Mixed => mig::resource_name(&m.profile),
        _ => WHOLE_GPU_RESOURCE.to_string(),
    }
}

fn resource_labels(
    res: &ResourcePlan,
    inventory: &Inventory,
    mig_strategy: MigStrategy,
    out: &mut NodeLabels,
) {
    let Some(first) = res.devices.first() else {
        return;
    };
    let name = res.name.as_str();
    let units = unit_facts(res, inventory);
    let count = unit_count(res);
    let renamed = name != node_resource(first, mig_strategy);
    let shared = res.replicas > 1;
    let strategy = match res.strategy {
        Strategy::Mps => "mps",
        Strategy::TimeSlicing if shared => "time-slicing",
        _ => "none",
    };
    let mut put = |suffix: &str, value: String| {
        let key = format!("{name}.{suffix}");
        let name_part = key.split_once('/').map_or(key.as_str(), |(_, n)| n);
        if name_part.len() > MAX_LABEL_NAME {
            out.warnings.push(format!(
                "resource {name}: label {key} is not written, its name part is longer than {MAX_LABEL_NAME} characters"
            ));
            return;
        }
        out.labels.insert(key, value);
    };
    put("count", count.to_string());
    put("replicas", res.replicas.to_string());
    put("sharing-strategy", strategy.to_string());
    // The unit with the least memory, the lowest index first (units are in index order).
    let Some(described) = units.iter().min_by_key(|u| u.memory_mib) else {
        return;
    };
    let differs = units
        .iter()
        .any(|u| u.model != described.model || u.memory_mib != described.memory_mib);
    let suffix = if shared && !renamed { "-SHARED" } else { "" };
    let mut parts = vec![described.model];
    if let Some(p) = described.profile {
        parts.extend(["MIG", p]);
    }
    let product = product_name(&parts, MAX_LABEL_VALUE - suffix.len());
    if !product.is_empty() {
        put("product", format!("{product}{suffix}"));
    }
    if described.memory_mib > 0 {
        put("memory", described.memory_mib.to_string());
    }
    if differs {
        let mut kinds: Vec<String> = units
            .iter()
            .map(|u| format!("{} {} MiB", u.model, u.memory_mib))
            .collect();
        kinds.sort();
        kinds.dedup();
        out.warnings.push(format!(
            "resource {name} is built on devices of different models or memory ({}); its product and memory labels describe GPU {}, the one with the least memory",
            kinds.join(", "),
            described.gpu_index
        ));
    }
}

/// The facts of each physical unit of `res` (once per unit, in device order): its GPU's index
/// and model, its memory and MIG profile; a unit whose GPU the inventory lacks is skipped.
fn unit_facts<'a>(res: &'a ResourcePlan, inventory: &'a Inventory) -> Vec<UnitFacts<'a>> {
    let mut units: Vec<UnitFacts<'_>> = Vec::new();
    let mut last: Option<&str> = None;
    for d in &res.devices {
        if last == Some(d.gpu_uuid.as_str()) {
            continue;
        }
        last = Some(d.gpu_uuid.as_str());
        let Some(gpu) = inventory.by_index(d.gpu_index) else {
            continue;
        };
        let (memory_mib, profile) = match &d.mig {
            None => (gpu.memory_mib, None),
            Some(m) => {
                let mem = gpu
                    .mig_devices
                    .iter()
                    .find(|x| x.uuid == d.gpu_uuid)
                    .map_or(0, |x| x.memory_mib);
                (mem, Some(m.profile.as_str()))
            }
        };
        units.push(UnitFacts {
            gpu_index: d.gpu_index,
            model: &gpu.model,
            memory_mib,
            profile,
        });
    }
    units
}

/// How many physical units (GPUs or MIG devices) `res`'s devices are on.
fn unit_count(res: &ResourcePlan) -> usize {
    let mut seen: Vec<&str> = res.devices.iter().map(|d| d.gpu_uuid.as_str()).collect();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

/// GFD's product name: each part with every character outside `[A-Za-z0-9_. -]` dropped and
/// runs of spaces turned into one `-`, the parts joined by `-`; then made a valid label value
/// of at most `max` characters ([`label_value`]).
fn product_name(parts: &[&str], max: usize) -> String {
    let cleaned: Vec<String> = parts
        .iter()
        .map(|p| {
            let kept: String = p
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
                .collect();
            kept.split_whitespace().collect::<Vec<_>>().join("-")
        })
        .filter(|p| !p.is_empty())
        .collect();
    bounded_value(&cleaned.join("-"), max)
}

/// `raw` as a valid Kubernetes label value: whitespace runs become `-`, other characters
/// outside `[A-Za-z0-9._-]` are dropped, the result is cut to 63 characters and trimmed to
/// start and end with an alphanumeric character (Kubernetes' label-value grammar,
/// `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?`). May be empty.
pub fn label_value(raw: &str) -> String {
    bounded_value(raw, MAX_LABEL_VALUE)
}

fn bounded_value(raw: &str, max: usize) -> String {
    let dashed = raw.split_whitespace().collect::<Vec<_>>().join("-");
    let mut kept: String = dashed
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(max)
        .collect();
    while kept.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        kept.pop();
    }
    let start = kept
        .find(|c: char| c.is_ascii_alphanumeric())
        .unwrap_or(kept.len());
    kept[start..].to_string()
}

/// Whether `value` satisfies the Kubernetes label-value grammar.
pub fn is_label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= MAX_LABEL_VALUE
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// The feature file's text in NFD's local-source format: [`HEADER`], then one `key=value` line
/// per label in key order, each ending in a newline.
pub fn render(labels: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(HEADER.len() + 1 + labels.len() * 48);
    out.push_str(HEADER);
    out.push('\n');
    for (k, v) in labels {
        out.push_str(k);
        out.push('=');
        out.push_str(v);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
