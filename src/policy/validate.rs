//! Validation of a parsed policy file: each section read into a [`Policy`], the first error
//! found (in the file's order of sections) reported.

use std::collections::BTreeMap;

use super::{
    delivery, err, mps, schema, DeviceRef, DeviceSelector, HealthPolicy, MemoryLimits, NvidiaXids,
    Policy, PolicyError, ResourceName, SharedResource, TimeSlicing, DEFAULT_IGNORED_XIDS,
};

/// NVIDIA's `health` keys, checked as NVIDIA's plugin checks them (an Xid in both lists is an
/// error), with a notice that they replace the default Xid classification. `None` when the
/// file sets none of them.
fn nvidia_xids(
    h: &schema::Health,
    notices: &mut Vec<String>,
) -> Result<Option<NvidiaXids>, PolicyError> {
    let nvidia_set = [
        ("disabled", h.disabled.is_some()),
        ("eventTypes", h.event_types.is_some()),
        ("ignoredXIDs", h.nvidia_ignored_xids.is_some()),
        ("criticalXIDs", h.nvidia_critical_xids.is_some()),
    ];
    let Some((first, _)) = nvidia_set.iter().find(|(_, set)| *set) else {
        return Ok(None);
    };
    if let Some(own) = [
        ("ignoredXids", h.ignored_xids.is_some()),
        ("criticalXids", h.critical_xids.is_some()),
    ]
    .iter()
    .find(|(_, set)| *set)
    {
        return Err(err(
            format!("health.{}", own.0),
            format!(
                "slicelet's health.{} and NVIDIA's health.{first} read Xids differently (NVIDIA's \
                 lists replace the default ignored Xids, slicelet's add to them): use one form",
                own.0
            ),
        ));
    }
    let ignored = h.nvidia_ignored_xids.clone().unwrap_or_default();
    let critical = match &h.nvidia_critical_xids {
        None | Some(schema::CriticalXids::All) => None,
        Some(schema::CriticalXids::Only(list)) => Some(list.clone()),
    };
    if let Some(x) = critical.iter().flatten().find(|x| ignored.contains(x)) {
        return Err(err(
            "health.criticalXIDs",
            format!("Xid {x} is in both health.ignoredXIDs and health.criticalXIDs"),
        ));
    }
    let xid_events = h
        .event_types
        .as_ref()
        .is_none_or(|t| t.contains(&schema::EventType::EventTypeXidCriticalError));
    let off = h.disabled == Some(true) || !xid_events;
    notices.push(nvidia_xids_notice(h, off, &ignored, critical.as_deref()));
    Ok(Some(NvidiaXids {
        off,
        ignored,
        critical,
    }))
}

/// The notice that NVIDIA's `health` keys replace the default Xid classification: no Xid
/// counts when `off`, else which Xids are ignored (`ignored`) and which are critical
/// (`critical`; `None`: every other one).
fn nvidia_xids_notice(
    h: &schema::Health,
    off: bool,
    ignored: &[u64],
    critical: Option<&[u64]>,
) -> String {
    let defaults = DEFAULT_IGNORED_XIDS.map(|x| x.to_string()).join(", ");
    if off {
        format!(
            "health: read as NVIDIA's plugin reads it, no Xid marks a GPU Unhealthy ({}); a GPU \
             that stops answering NVML still does",
            if h.disabled == Some(true) {
                "disabled: true"
            } else {
                "eventTypes without EventTypeXidCriticalError"
            }
        )
    } else {
        format!(
            "health: read as NVIDIA's plugin reads it, the Xids ignored are ignoredXIDs' ({}) in \
             place of NVIDIA's defaults ({defaults}), and {}",
            if ignored.is_empty() {
                "none".to_string()
            } else {
                ignored
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            match critical {
                None => "every other Xid is critical".to_string(),
                Some(c) => format!(
                    "only criticalXIDs' are critical ({})",
                    c.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
                ),
            }
        )
    }
}

pub(super) fn validate(file: schema::ConfigFile) -> Result<Policy, PolicyError> {
    let mut policy = Policy::default();
    let mut ignored = Vec::new();

    if let Some(flags) = &file.flags {
        read_flags(flags, &mut policy, &mut ignored)?;
    }
    if file.resources.is_some() {
        ignored.push("resources".to_string());
    }
    if file.imex.is_some() {
        ignored.push("imex".to_string());
    }
    if let Some(h) = &file.health {
        policy.health = read_health(h, &mut policy.notices)?;
    }

    // Entries that say `dra: false` in so many words: a `dra.resources` item naming what one
    // advertises contradicts it (checked below, once the advertised names are known).
    let says_not_dra = not_dra_paths(file.sharing.as_ref());
    if let Some(sharing) = file.sharing {
        if let Some(ts) = sharing.time_slicing {
            policy.time_slicing = validate_replicated(
                ts,
                "sharing.timeSlicing",
                &mut policy.notices,
                &mut policy.lenient,
                &mut policy.extensions,
            )?;
        }
        if let Some(m) = sharing.mps {
            policy.mps = mps::validate_mps(
                m,
                &policy.time_slicing,
                &mut policy.notices,
                &mut policy.lenient,
                &mut policy.extensions,
            )?;
        }
    }
    let mut listed = std::collections::BTreeSet::new();
    if let Some(d) = &file.dra {
        listed = read_dra(d, &mut policy, &says_not_dra)?;
    }
    let from_entries: Vec<ResourceName> = shared_entries(&policy)
        .filter(|e| e.dra)
        .map(|e| e.advertised.clone())
        .collect();
    policy.dra = listed;
    policy.dra.extend(from_entries);
    policy.ignored_keys = ignored;
    Ok(policy)
}

/// The time-slicing and MPS entries of `policy`, in that order.
fn shared_entries(policy: &Policy) -> impl Iterator<Item = &SharedResource> {
    policy
        .time_slicing
        .resources
        .iter()
        .chain(policy.mps.resources.iter().map(|m| &m.shared))
}

/// The `dra` section: the names `dra.resources` lists (each once, none that an entry saying
/// `dra: false` advertises: `says_not_dra` holds those entries' paths), and the Xid taint
/// effect into `policy`.
fn read_dra(
    d: &schema::Dra,
    policy: &mut Policy,
    says_not_dra: &std::collections::BTreeSet<String>,
) -> Result<std::collections::BTreeSet<ResourceName>, PolicyError> {
    let mut listed = std::collections::BTreeSet::new();
    for (i, name) in d.resources.iter().flatten().enumerate() {
        if !listed.insert(name.clone()) {
            return Err(err(
                format!("dra.resources[{i}]"),
                format!("{name} is listed twice"),
            ));
        }
        // One name, one path: an entry that asks for the device plugin by name cannot be
        // DRA's because of this list.
        if let Some(e) =
            shared_entries(policy).find(|e| &e.advertised == name && says_not_dra.contains(&e.path))
        {
            return Err(err(
                format!("{}.dra", e.path),
                format!(
                    "false, but dra.resources[{i}] lists {name}, which this entry advertises; a node serves a name through the device plugin or through DRA, not both: remove one of the two"
                ),
            ));
        }
    }
    if let Some(m) = &d.dynamic_mig {
        policy.dynamic_mig = Some(dynamic_mig(m, policy)?);
    }
    if let Some(effect) = d.xid_taint_effect {
        policy.dra_xid_taint_effect = effect;
        policy.extensions.push(format!(
            "dra.xidTaintEffect: {}: the effect of the DRA device taint on a device with a critical Xid is a slicelet extension; NVIDIA's plugin has no such key",
            effect.as_str()
        ));
    }
    Ok(listed)
}

/// The `flags` section: the flags slicelet acts on into `policy`, the ones it does not into
/// `ignored` (as `flags.<key>`).
fn read_flags(
    flags: &schema::Flags,
    policy: &mut Policy,
    ignored: &mut Vec<String>,
) -> Result<(), PolicyError> {
    policy.mig_strategy = flags.mig_strategy.unwrap_or_default();
    policy.fail_on_init_error = flags.fail_on_init_error.unwrap_or(true);
    policy.mps_root = mps::validate_root(flags.mps_root.as_deref())?;
    let not_acted: [(&str, bool); 9] = [
        (
            "restartOnDeviceUnhealthy",
            flags.restart_on_device_unhealthy.is_some(),
        ),
        ("nvidiaDriverRoot", flags.nvidia_driver_root.is_some()),
        ("nvidiaDevRoot", flags.nvidia_dev_root.is_some()),
        ("gdrcopyEnabled", flags.gdrcopy_enabled.is_some()),
        ("gdsEnabled", flags.gds_enabled.is_some()),
        ("mofedEnabled", flags.mofed_enabled.is_some()),
        ("useNodeFeatureAPI", flags.use_node_feature_api.is_some()),
        (
            "deviceDiscoveryStrategy",
            flags.device_discovery_strategy.is_some(),
        ),
        ("gfd", flags.gfd.is_some()),
    ];
    ignored.extend(
        not_acted
            .iter()
            .filter(|(_, set)| *set)
            .map(|(k, _)| format!("flags.{k}")),
    );
    if let Some(plugin) = &flags.plugin {
        read_plugin_flags(plugin, policy, ignored)?;
    }
    Ok(())
}

/// `flags.plugin`: the keys slicelet acts on into `policy`, the ones it does not into `ignored`
/// (as `flags.plugin.<key>`).
fn read_plugin_flags(
    plugin: &schema::PluginFlags,
    policy: &mut Policy,
    ignored: &mut Vec<String>,
) -> Result<(), PolicyError> {
    policy.pass_device_specs = plugin.pass_device_specs.unwrap_or(false);
    policy.shared_allocation = plugin.shared_devices_allocation_policy.unwrap_or_default();
    if let Some(list) = plugin.device_list_strategy {
        policy.delivery.strategies = list;
    }
    policy.delivery.id = plugin.device_id_strategy.unwrap_or_default();
    if let Some(prefix) = &plugin.cdi_annotation_prefix {
        delivery::validate_prefix(prefix)
            .map_err(|e| err("flags.plugin.cdiAnnotationPrefix", e.to_string()))?;
        policy.delivery.annotation_prefix.clone_from(prefix);
    }
    let not_acted: [(&str, bool); 4] = [
        ("nvidiaCTKPath", plugin.nvidia_ctk_path.is_some()),
        (
            "containerDriverRoot",
            plugin.container_driver_root.is_some(),
        ),
        ("kubeletSocket", plugin.kubelet_socket.is_some()),
        ("cdiFeatureFlags", plugin.cdi_feature_flags.is_some()),
    ];
    ignored.extend(
        not_acted
            .iter()
            .filter(|(_, set)| *set)
            .map(|(k, _)| format!("flags.plugin.{k}")),
    );
    Ok(())
}

/// The `health` section: slicelet's Xid lists (an Xid in both is an error) and NVIDIA's keys
/// ([`nvidia_xids`], whose notice goes to `notices`).
fn read_health(h: &schema::Health, notices: &mut Vec<String>) -> Result<HealthPolicy, PolicyError> {
    let ignored_xids = h.ignored_xids.clone().unwrap_or_default();
    let critical_xids = h.critical_xids.clone().unwrap_or_default();
    if let Some(x) = ignored_xids.iter().find(|x| critical_xids.contains(x)) {
        return Err(err(
            "health.criticalXids",
            format!("Xid {x} is also in health.ignoredXids; list it in one of them"),
        ));
    }
    Ok(HealthPolicy {
        ignored_xids,
        critical_xids,
        nvidia: nvidia_xids(h, notices)?,
        recovery: h
            .recovery_seconds
            .map(|s| std::time::Duration::from_secs_f64(s.0.min(1e9))),
    })
}

/// The field paths of the sharing entries with `dra: false` written out
/// (`sharing.timeSlicing.resources[2]`), in the paths [`validate_replicated`] gives them.
fn not_dra_paths(sharing: Option<&schema::Sharing>) -> std::collections::BTreeSet<String> {
    let Some(sharing) = sharing else {
        return std::collections::BTreeSet::new();
    };
    let ts = sharing
        .time_slicing
        .iter()
        .flat_map(|t| t.resources.iter().flatten())
        .map(|e| e.dra);
    let mps = sharing
        .mps
        .iter()
        .flat_map(|m| m.resources.iter().flatten())
        .map(|e| e.dra);
    ts.enumerate()
        .filter(|(_, dra)| *dra == Some(schema::DraMode::Off))
        .map(|(i, _)| format!("sharing.timeSlicing.resources[{i}]"))
        .chain(
            mps.enumerate()
                .filter(|(_, dra)| *dra == Some(schema::DraMode::Off))
                .map(|(i, _)| format!("sharing.mps.resources[{i}]")),
        )
        .collect()
}

pub(super) fn validate_replicated(
    ts: schema::ReplicatedResources,
    base: &str,
    notices: &mut Vec<String>,
    lenient: &mut Vec<String>,
    extensions: &mut Vec<String>,
) -> Result<TimeSlicing, PolicyError> {
    let rename_by_default = ts.rename_by_default.unwrap_or(false);
    let mut out = TimeSlicing {
        fail_requests_greater_than_one: ts.fail_requests_greater_than_one.unwrap_or(false),
        resources: Vec::new(),
    };
    let mut by_name: BTreeMap<ResourceName, String> = BTreeMap::new();
    for (i, entry) in ts.resources.unwrap_or_default().into_iter().enumerate() {
        let path = format!("{base}.resources[{i}]");
        let advertised = match (&entry.rename, rename_by_default) {
            (Some(r), _) => r.clone(),
            (None, true) => entry
                .name
                .shared()
                .map_err(|m| err(format!("{path}.name"), format!("with renameByDefault: {m}")))?,
            (None, false) => entry.name.clone(),
        };
        if let Some(other) = by_name.insert(advertised.clone(), path.clone()) {
            return Err(err(
                path.clone(),
                format!("advertises {advertised}, which {other} already advertises; give one of them another rename"),
            ));
        }
        out.resources.push(replicated_entry(
            entry,
            path,
            advertised,
            &mut Notes {
                notices: &mut *notices,
                lenient: &mut *lenient,
                extensions: &mut *extensions,
            },
        )?);
    }
    Ok(out)
}

/// Where [`validate_replicated`]'s readings go: notices, lenient readings and extensions.
struct Notes<'a> {
    notices: &'a mut Vec<String>,
    lenient: &'a mut Vec<String>,
    extensions: &'a mut Vec<String>,
}

/// One `resources[i]` entry of a replicated-resources section (at `path`, advertised as
/// `advertised`): its devices, memory limits and DRA mode checked, with their notes.
fn replicated_entry(
    entry: schema::ReplicatedResource,
    path: String,
    advertised: ResourceName,
    notes: &mut Notes,
) -> Result<SharedResource, PolicyError> {
    if let Some(rename) = &entry.rename {
        notes.notices.push(format!(
            "{path}.rename: slicelet honours rename (NVIDIA's plugin ignores it): pods must request {rename}"
        ));
    }
    let devices = lenient_devices(
        entry.devices.clone().unwrap_or_default(),
        &format!("{path}.devices"),
        notes.lenient,
    );
    if devices != DeviceSelector::All {
        notes.notices.push(if advertised == entry.name {
            format!(
                "{path}.devices: NVIDIA's plugin ignores devices and shares all; slicelet shares only the listed devices unless other devices of {advertised} would then stay whole under the same name (it shares all then, with a warning)"
            )
        } else {
            format!(
                "{path}.devices: slicelet shares only the listed devices (NVIDIA's plugin ignores devices and shares all)"
            )
        });
    }
    let memory = match entry.memory {
        Some(m) => {
            let limits = memory_limits(&m, &path)?;
            notes.extensions.push(format!(
                "{path}.memory: per-replica GPU memory limits are a slicelet extension; NVIDIA's plugin ignores them and enforces nothing"
            ));
            Some(limits)
        }
        None => None,
    };
    let mode = entry.dra.unwrap_or(schema::DraMode::Off);
    let capacity_shares = (mode == schema::DraMode::Capacity).then_some(entry.replicas.0);
    if capacity_shares.is_some() && memory.is_some() {
        return Err(err(
            format!("{path}.memory"),
            "dra: capacity shares take their memory from each claim's capacity request (exactly.capacity.requests.memory); drop memory or use dra: true".to_string(),
        ));
    }
    if capacity_shares.is_some() {
        notes.extensions.push(format!(
            "{path}.dra: capacity publishes each GPU once as a consumable-capacity DRA device (Kubernetes 1.36 or later); a slicelet extension"
        ));
    }
    Ok(SharedResource {
        path,
        source: entry.name,
        advertised,
        devices,
        replicas: if capacity_shares.is_some() {
            1
        } else {
            entry.replicas.0
        },
        dra: mode != schema::DraMode::Off,
        capacity_shares,
        memory,
    })
}

/// `memory` checked: `soft` at most `hard`.
fn memory_limits(m: &schema::MemorySpec, path: &str) -> Result<MemoryLimits, PolicyError> {
    if let Some(soft) = &m.soft {
        if soft.mib > m.hard.mib {
            return Err(err(
                format!("{path}.memory.soft"),
                format!(
                    "{} ({} MiB) is more than memory.hard {} ({} MiB); the guaranteed share cannot exceed the limit",
                    soft.text, soft.mib, m.hard.text, m.hard.mib
                ),
            ));
        }
    }
    Ok(MemoryLimits {
        hard_mib: m.hard.mib,
        soft_mib: m.soft.as_ref().map(|s| s.mib),
        enforce: m.enforce.unwrap_or_default(),
    })
}

/// `devices` with each device once; a warning in `lenient` for each device listed twice and
/// each UUID in a form NVML never reports (NVIDIA's plugin accepts both).
fn lenient_devices(
    devices: DeviceSelector,
    path: &str,
    lenient: &mut Vec<String>,
) -> DeviceSelector {
    let DeviceSelector::List(list) = devices else {
        return devices;
    };
    let mut once: Vec<DeviceRef> = Vec::with_capacity(list.len());
    for (i, d) in list.into_iter().enumerate() {
        if once.contains(&d) {
            lenient.push(format!("{path}[{i}]: {d} is listed twice; it counts once"));
            continue;
        }
        if let DeviceRef::Unmatchable(u) = &d {
            lenient.push(format!(
                "{path}[{i}]: {} is a UUID form NVML never reports (it names devices GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx); it matches no device, as in NVIDIA's plugin",
                crate::uuid::truncate_id(u)
            ));
        }
        once.push(d);
    }
    DeviceSelector::List(once)
}

/// `dra.dynamicMig`: its `devices` (required; GPUs only, each once, as [`lenient_devices`]
/// reads a list), none of them shared by a time-slicing or MPS entry that names it too (a
/// dynamic MIG GPU is partitioned, not shared; the plan refuses the overlaps only the node
/// shows). Noted as an extension.
fn dynamic_mig(m: &schema::DynamicMig, policy: &mut Policy) -> Result<DeviceSelector, PolicyError> {
    const PATH: &str = "dra.dynamicMig.devices";
    let Some(devices) = m.devices.clone() else {
        return Err(err(
            PATH,
            "missing: list the GPUs to partition on demand (all, a count, GPU indices or GPU UUIDs)",
        ));
    };
    if let DeviceSelector::List(list) = &devices {
        for (i, d) in list.iter().enumerate() {
            let mig = match d {
                DeviceRef::MigIndex(..) | DeviceRef::LegacyMig { .. } => true,
                DeviceRef::Uuid(u) => u.starts_with("MIG-"),
                DeviceRef::Index(_) | DeviceRef::Unmatchable(_) => false,
            };
            if mig {
                return Err(err(
                    format!("{PATH}[{i}]"),
                    format!("{d} names a MIG device; dynamic MIG partitions whole GPUs: give the GPU's index or GPU UUID"),
                ));
            }
        }
    }
    let devices = lenient_devices(devices, PATH, &mut policy.lenient);
    if let Some((entry, gpu)) = shared_entries(policy)
        .find_map(|e| shared_dynamic_gpu(&e.devices, &devices).map(|g| (e.path.clone(), g)))
    {
        return Err(err(
            format!("{entry}.devices"),
            format!("shares GPU {gpu}, which dra.dynamicMig.devices partitions on demand; time-slicing and MPS on a dynamic MIG GPU are not supported: leave it out of one of the two"),
        ));
    }
    policy.extensions.push(format!(
        "{PATH}: dynamic MIG (MIG devices created for each DRA claim, Kubernetes 1.36 or later) is a slicelet extension"
    ));
    Ok(devices)
}

/// A GPU both `shared` (a sharing entry's devices) and `dynamic` name in so many words (the
/// same index or GPU UUID, or a MIG device `<gpu>:<m>` of a dynamic GPU index), as written.
fn shared_dynamic_gpu(shared: &DeviceSelector, dynamic: &DeviceSelector) -> Option<String> {
    let (DeviceSelector::List(s), DeviceSelector::List(d)) = (shared, dynamic) else {
        return None;
    };
    s.iter().find_map(|r| {
        d.iter()
            .find(|g| match (r, g) {
                (DeviceRef::Index(a) | DeviceRef::MigIndex(a, _), DeviceRef::Index(b)) => a == b,
                (DeviceRef::Uuid(a), DeviceRef::Uuid(b)) => a == b,
                (DeviceRef::LegacyMig { gpu, .. }, DeviceRef::Uuid(b)) => gpu == b,
                _ => false,
            })
            .map(ToString::to_string)
    })
}
