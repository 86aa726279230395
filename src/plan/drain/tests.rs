use super::*;
use crate::inventory::test_node;
use crate::plan::build;
use crate::policy::parse;

const GPU: &str = "nvidia.com/gpu";

fn uuid(i: u32) -> String {
    format!("GPU-{i:08}-0000-0000-0000-000000000000")
}

fn policy(replicas: u32) -> crate::policy::Policy {
    if replicas == 0 {
        return parse("version: v1\n").unwrap();
    }
    parse(&format!(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
    ))
    .unwrap()
}

fn holder(pod: &str) -> Holder {
    Holder {
        namespace: "default".into(),
        pod: pod.into(),
        container: "main".into(),
    }
}

fn held(ids: &[(&str, &str)]) -> InUse {
    let mut u = InUse::default();
    for (id, pod) in ids {
        u.insert(GPU, id, holder(pod));
    }
    u
}

/// The plan `replicas` (0: whole GPUs) builds on `n` GPUs, with the drain rules applied
/// against `previous`.
fn plan(replicas: u32, n: u32, previous: &Plan, in_use: &InUse) -> Plan {
    let inv = test_node(n);
    let mut p = build(&policy(replicas), &inv).unwrap().plan;
    apply(&mut p, previous, in_use, &inv);
    p
}

/// `(id, health)` of every device of `resource`, in order.
fn listed(p: &Plan, resource: &str) -> Vec<(String, &'static str)> {
    p.resources[resource]
        .devices
        .iter()
        .map(|d| (d.id.clone(), d.health.as_str()))
        .collect()
}

#[test]
fn nothing_held_changes_nothing() {
    let before = plan(4, 2, &Plan::default(), &InUse::default());
    let after = plan(2, 2, &before, &InUse::default());
    let raw = build(&policy(2), &test_node(2)).unwrap().plan;
    assert_eq!(after, raw);
    assert!(after.drain.is_empty());
}

#[test]
fn whole_to_shared_while_held_keeps_the_whole_gpu_and_drains_its_replicas() {
    let before = plan(0, 2, &Plan::default(), &InUse::default());
    let in_use = held(&[(&uuid(0), "a")]);
    let after = plan(4, 2, &before, &in_use);
    let want: Vec<(String, &str)> = [
        (uuid(0), "Healthy"),
        (format!("{}::0", uuid(0)), "Unhealthy"),
        (format!("{}::1", uuid(0)), "Unhealthy"),
        (format!("{}::2", uuid(0)), "Unhealthy"),
        (format!("{}::3", uuid(0)), "Unhealthy"),
    ]
    .into_iter()
    .chain((0..4).map(|n| (format!("{}::{n}", uuid(1)), "Healthy")))
    .collect();
    let got = listed(&after, GPU);
    assert_eq!(got.len(), want.len());
    let mut sorted_want = want.clone();
    sorted_want.sort();
    let mut sorted_got = got.clone();
    sorted_got.sort();
    assert_eq!(sorted_got, sorted_want);
    assert_eq!(
        after.drain.retained[GPU],
        BTreeSet::from([uuid(0)]),
        "the whole GPU the pod holds stays advertised"
    );
    assert_eq!(
        after.drain.draining[GPU][&format!("{}::2", uuid(0))],
        "draining: held by default/a"
    );
    assert_eq!(after.drain.draining[GPU].len(), 4);
    // The whole device keeps its place first on GPU 0 (devices stay in GPU order).
    assert_eq!(got[0].0, uuid(0));
}

#[test]
fn four_to_two_replicas_keeps_the_held_replica_and_drains_the_rest_of_its_gpu() {
    let before = plan(4, 2, &Plan::default(), &InUse::default());
    let id3 = format!("{}::3", uuid(0));
    let in_use = held(&[(&id3, "b")]);
    let after = plan(2, 2, &before, &in_use);
    assert_eq!(
        listed(&after, GPU),
        vec![
            (format!("{}::0", uuid(0)), "Unhealthy"),
            (format!("{}::1", uuid(0)), "Unhealthy"),
            (id3.clone(), "Healthy"),
            (format!("{}::0", uuid(1)), "Healthy"),
            (format!("{}::1", uuid(1)), "Healthy"),
        ]
    );
    assert_eq!(after.drain.retained[GPU], BTreeSet::from([id3.clone()]));
    // The retained replica is served with its old shape's siblings gone: Allocate still finds it.
    assert!(after.resources[GPU].device(&id3).is_some());
    // Released: withdrawn, and GPU 0's replicas are Healthy again.
    let released = plan(2, 2, &after, &InUse::default());
    assert_eq!(released, build(&policy(2), &test_node(2)).unwrap().plan);
}

#[test]
fn a_drain_lasts_across_replans_while_the_holder_stays() {
    let before = plan(4, 1, &Plan::default(), &InUse::default());
    let id3 = format!("{}::3", uuid(0));
    let in_use = held(&[(&id3, "b")]);
    let once = plan(2, 1, &before, &in_use);
    // Another replan (a health change, a resync) with the same holder: the same plan.
    let twice = plan(2, 1, &once, &in_use);
    assert_eq!(once, twice);
}

#[test]
fn a_held_replica_that_stays_keeps_its_health_and_the_new_ones_drain() {
    // 2 → 4 replicas while ::0 is held: ::0 exists in both, but its GPU is now shared by 4.
    let before = plan(2, 1, &Plan::default(), &InUse::default());
    let id0 = format!("{}::0", uuid(0));
    let after = plan(4, 1, &before, &held(&[(&id0, "a")]));
    assert_eq!(
        listed(&after, GPU),
        vec![
            (id0.clone(), "Healthy"),
            (format!("{}::1", uuid(0)), "Unhealthy"),
            (format!("{}::2", uuid(0)), "Unhealthy"),
            (format!("{}::3", uuid(0)), "Unhealthy"),
        ]
    );
    assert!(after.drain.retained.is_empty());
}

#[test]
fn same_shape_while_held_is_no_drain() {
    let before = plan(4, 1, &Plan::default(), &InUse::default());
    let id0 = format!("{}::0", uuid(0));
    let after = plan(4, 1, &before, &held(&[(&id0, "a")]));
    assert!(after.drain.is_empty());
    assert_eq!(after, before);
}

#[test]
fn a_retained_device_on_an_unhealthy_gpu_is_unhealthy() {
    let before = plan(4, 1, &Plan::default(), &InUse::default());
    let mut inv = test_node(1);
    inv.gpus[0].health = Health::Unhealthy;
    let id3 = format!("{}::3", uuid(0));
    let mut p = build(&policy(2), &inv).unwrap().plan;
    apply(&mut p, &before, &held(&[(&id3, "b")]), &inv);
    assert_eq!(
        p.resources[GPU].device(&id3).unwrap().health,
        Health::Unhealthy
    );
}

#[test]
fn after_a_restart_a_held_id_is_shaped_from_the_inventory() {
    // No previous plan (slicelet restarted with the new policy): the held whole GPU is
    // known by its UUID alone.
    let in_use = held(&[(&uuid(1), "c"), ("GPU-nothing-here", "d")]);
    let after = plan(2, 2, &Plan::default(), &in_use);
    let d = after.resources[GPU].device(&uuid(1)).expect("retained");
    assert_eq!(
        (d.gpu_index, d.replica, d.health),
        (1, None, Health::Healthy)
    );
    assert_eq!(after.drain.retained[GPU], BTreeSet::from([uuid(1)]));
    // GPU 1's replicas drain; GPU 0 is untouched; the unknown ID is not advertised.
    assert_eq!(after.drain.draining[GPU].len(), 2);
    assert!(after.drain.draining[GPU]
        .keys()
        .all(|id| id.starts_with(&uuid(1))));
    assert!(after.resources[GPU].device("GPU-nothing-here").is_none());
}

#[test]
fn a_resource_the_policy_dropped_lives_on_for_its_holders() {
    // Renamed away: nvidia.com/gpu → nvidia.com/gpu-shared, while GPU 0 is held whole.
    let before = plan(0, 2, &Plan::default(), &InUse::default());
    let inv = test_node(2);
    let renamed = parse(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-shared\n        replicas: 2\n",
    )
    .unwrap();
    let mut p = build(&renamed, &inv).unwrap().plan;
    assert!(!p.resources.contains_key(GPU));
    apply(&mut p, &before, &held(&[(&uuid(0), "a")]), &inv);
    assert_eq!(listed(&p, GPU), vec![(uuid(0), "Healthy")]);
    let shared = "nvidia.com/gpu-shared";
    assert_eq!(
        p.drain.draining[shared].keys().cloned().collect::<Vec<_>>(),
        vec![format!("{}::0", uuid(0)), format!("{}::1", uuid(0))]
    );
    // The kept resource has its old shape (whole GPUs).
    assert_eq!(p.resources[GPU].strategy, Strategy::None);
}

#[test]
fn the_reason_names_every_pod_once() {
    let before = plan(4, 1, &Plan::default(), &InUse::default());
    let mut in_use = held(&[
        (&format!("{}::3", uuid(0)), "b"),
        (&format!("{}::2", uuid(0)), "a"),
    ]);
    in_use.insert(
        GPU,
        &format!("{}::3", uuid(0)),
        Holder {
            namespace: "default".into(),
            pod: "b".into(),
            container: "sidecar".into(),
        },
    );
    let after = plan(0, 1, &before, &in_use);
    assert_eq!(
        after.drain.draining[GPU][&uuid(0)],
        "draining: held by default/a, default/b"
    );
}

// ---- regression tests for defects a hostile review found (each failed before its fix; the
// comments say what went wrong then) ----

#[test]
fn a_drain_of_a_held_replica_that_stays_lasts_across_replans() {
    // 2 → 4 replicas while ::0 is held: ::1..::3 drain (the test above). Any later replan
    // (a health change, a pod-resources refresh) with the same holder must keep them
    // Unhealthy: the holder still shares GPU 0 two ways.
    let before = plan(2, 1, &Plan::default(), &InUse::default());
    let id0 = format!("{}::0", uuid(0));
    let in_use = held(&[(&id0, "a")]);
    let once = plan(4, 1, &before, &in_use);
    assert_eq!(once.drain.draining[GPU].len(), 3);
    let twice = plan(4, 1, &once, &in_use);
    assert_eq!(
        listed(&twice, GPU),
        listed(&once, GPU),
        "the second replan turned the drained replicas Healthy while ::0 is still held"
    );
}

#[test]
fn a_gpu_moved_to_dra_while_a_device_plugin_pod_holds_it_is_not_published_through_dra() {
    // GPU 0 is held whole through the device plugin; the policy now serves nvidia.com/gpu
    // through DRA (same shape). The device plugin stops serving it and DRA publishes it:
    // a claim can get the GPU the running pod holds.
    let before = plan(0, 1, &Plan::default(), &InUse::default());
    let inv = test_node(1);
    let dra = parse("version: v1\ndra:\n  resources: [nvidia.com/gpu]\n").unwrap();
    let mut p = build(&dra, &inv).unwrap().plan;
    apply(&mut p, &before, &held(&[(&uuid(0), "a")]), &inv);
    let (published, _) = crate::dra::pool::published(crate::dra::slices::dra_resources(&p));
    let ids: Vec<&str> = published.iter().map(|(d, _, _)| d.id.as_str()).collect();
    assert!(
        !ids.contains(&uuid(0).as_str()),
        "DRA publishes {ids:?}, including the GPU a device-plugin pod holds (drain: {:?})",
        p.drain
    );
}

/// The same after a restart of slicelet with the changed policy: no plan came before, but
/// pod-resources lists the GPU as a device-plugin device, so the resource stays on the device
/// plugin while the pod runs (DRA published GPU 0 and prepared a claim on it).
#[test]
fn after_a_restart_a_gpu_a_device_plugin_pod_holds_is_not_published_through_dra() {
    let inv = test_node(1);
    let dra = parse("version: v1\ndra:\n  resources: [nvidia.com/gpu]\n").unwrap();
    let mut p = build(&dra, &inv).unwrap().plan;
    apply(&mut p, &Plan::default(), &held(&[(&uuid(0), "a")]), &inv);
    assert!(!p.resources[GPU].dra, "{:?}", p.drain);
    let (published, _) = crate::dra::pool::published(crate::dra::slices::dra_resources(&p));
    assert!(published.is_empty(), "{published:?}");
    // Released: the next plan moves it to DRA.
    let mut p = build(&dra, &inv).unwrap().plan;
    let before = p.clone();
    apply(&mut p, &before, &InUse::default(), &inv);
    assert!(p.resources[GPU].dra);
}

fn claimed(names: &[(String, &str)]) -> InUse {
    let mut u = InUse::default();
    for (name, pod) in names {
        u.claimed.insert(name.clone(), vec![holder(pod)]);
    }
    u
}

/// Under DRA alone, time-slicing → MPS while a time-sliced claim holds GPU 0's replica 0 (the
/// holder known from the DRA checkpoint or pod-resources): GPU 0's new MPS devices drain, so no
/// MPS claim is prepared on a GPU a time-sliced claim still uses; GPU 1 is MPS at once.
#[test]
fn a_strategy_change_under_a_claim_drains_its_gpu() {
    let inv = test_node(2);
    let ts = parse("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: true\n").unwrap();
    let mps = parse("version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: true\n").unwrap();
    let before = build(&ts, &inv).unwrap().plan;
    let mut p = build(&mps, &inv).unwrap().plan;
    let claim = crate::plan::dra_names::device_name(&format!("{}::0", uuid(0)));
    apply(&mut p, &before, &claimed(&[(claim, "a")]), &inv);
    assert_eq!(
        listed(&p, GPU),
        [
            (format!("{}::0", uuid(0)), "Healthy"),
            (format!("{}::1", uuid(0)), "Unhealthy"),
            (format!("{}::0", uuid(1)), "Healthy"),
            (format!("{}::1", uuid(1)), "Healthy"),
        ]
    );
}

/// After a restart with `dra` dropped, a claim still holding GPU 0 (known from pod-resources'
/// `dynamic_resources` or the DRA checkpoint) keeps the resource on DRA: the device plugin
/// does not advertise GPU 0 to a second holder (it did: no plan before, so no path known).
#[test]
fn after_a_restart_a_gpu_a_claim_holds_stays_on_dra() {
    let inv = test_node(2);
    let mut p = build(&policy(0), &inv).unwrap().plan;
    let claim = crate::plan::dra_names::device_name(&uuid(0));
    apply(&mut p, &Plan::default(), &claimed(&[(claim, "a")]), &inv);
    assert!(p.resources[GPU].dra, "{:?}", p.drain);
}

/// After a restart with a reshaped policy, a claim on a device no plan names any more (a
/// replica of a DRA resource that is now whole GPUs) holds its whole GPU: GPU 0's new devices
/// drain, GPU 1's do not.
#[test]
fn after_a_restart_a_claim_on_a_device_no_plan_names_drains_its_gpu() {
    let inv = test_node(2);
    let mut p = build(&policy(0), &inv).unwrap().plan;
    let claim = crate::plan::dra_names::device_name(&format!("{}::1", uuid(0)));
    apply(&mut p, &Plan::default(), &claimed(&[(claim, "a")]), &inv);
    assert_eq!(
        listed(&p, GPU),
        [(uuid(0), "Unhealthy"), (uuid(1), "Healthy")]
    );
    assert_eq!(
        p.drain.draining[GPU][&uuid(0)],
        "draining: held by default/a"
    );
}

#[test]
fn a_retained_device_does_not_move_a_dra_resource_back_to_the_device_plugin() {
    // nvidia.com/gpu, 4 replicas through the device plugin, GPU 0's ::3 held; the policy
    // now has 2 replicas served through DRA. ::3 is retained, but the merge (`rebuilt`)
    // drops `dra`, so GPU 1 (held by nobody) is served by the device plugin and not DRA.
    let before = plan(4, 2, &Plan::default(), &InUse::default());
    let inv = test_node(2);
    let dra = parse("version: v1\ndra:\n  resources: [nvidia.com/gpu]\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n").unwrap();
    let mut p = build(&dra, &inv).unwrap().plan;
    assert!(p.resources[GPU].dra);
    apply(
        &mut p,
        &before,
        &held(&[(&format!("{}::3", uuid(0)), "b")]),
        &inv,
    );
    assert!(
        p.resources[GPU].dra,
        "after the drain rules nvidia.com/gpu is a device-plugin resource again"
    );
}

#[test]
fn a_held_id_of_a_resource_slicelet_never_served_is_not_adopted() {
    // Another device plugin on the node (say NVIDIA's, as example.com/gpu) names its devices
    // by GPU UUID too; pod-resources lists its pod. slicelet served only nvidia.com/gpu and
    // has been running (the previous plan is not empty). The drain rules adopt the other
    // plugin's resource (slicelet would register it, replacing the other plugin) and hold
    // all of GPU 0's own replicas Unhealthy "draining" for as long as that pod runs.
    let before = plan(4, 1, &Plan::default(), &InUse::default());
    let mut in_use = InUse::default();
    in_use.insert("example.com/gpu", &uuid(0), holder("other"));
    let after = plan(4, 1, &before, &in_use);
    assert!(
        !after.resources.contains_key("example.com/gpu"),
        "slicelet now serves another plugin's resource: {:?}",
        after.drain
    );
    assert!(
        after.drain.draining.is_empty(),
        "{:?}",
        after.drain.draining
    );
}

#[test]
fn a_gpu_moved_from_dra_to_the_device_plugin_while_a_claim_holds_it_is_not_advertised_healthy() {
    // GPU 0 is served through DRA and a running pod's claim holds it whole; pod-resources
    // says so (`dynamic_resources`). The policy drops `dra`: the device plugin advertises
    // GPU 0 Healthy at once and the kubelet can give it to a second pod, because the drain
    // rules only know device-plugin IDs (InUse::from_list reads `devices` only).
    use crate::api::podresources::{
        ClaimResource, ContainerResources, DynamicResource, ListPodResourcesResponse, PodResources,
    };
    let inv = test_node(1);
    let dra = parse("version: v1\ndra:\n  resources: [nvidia.com/gpu]\n").unwrap();
    let before = build(&dra, &inv).unwrap().plan;
    let answer = ListPodResourcesResponse {
        pod_resources: vec![PodResources {
            name: "trainer".into(),
            namespace: "ml".into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                dynamic_resources: vec![DynamicResource {
                    claim_name: "gpu".into(),
                    claim_namespace: "ml".into(),
                    claim_resources: vec![ClaimResource {
                        driver_name: "gpu.slicelet.io".into(),
                        pool_name: "node-1".into(),
                        device_name: crate::plan::dra_names::device_name(&uuid(0)),
                        ..Default::default()
                    }],
                }],
                ..Default::default()
            }],
        }],
    };
    let in_use = InUse::from_list(&answer);
    let mut p = build(&policy(0), &inv).unwrap().plan;
    apply(&mut p, &before, &in_use, &inv);
    // The resource stays on DRA (the device plugin does not serve it) until the claim is gone.
    let res = &p.resources[GPU];
    let dp_healthy = !res.dra
        && res
            .devices
            .iter()
            .any(|d| d.id == uuid(0) && d.health == Health::Healthy);
    assert!(
        !dp_healthy,
        "the device plugin advertises the GPU a DRA claim holds (held: {in_use:?})"
    );
    assert!(res.dra);
    // Released: the device plugin serves it.
    let mut q = build(&policy(0), &inv).unwrap().plan;
    apply(&mut q, &p, &InUse::default(), &inv);
    assert!(!q.resources[GPU].dra);
}

#[test]
fn a_published_device_name_reads_back_to_its_unit() {
    let inv = test_node(2);
    let g1 = &inv.gpus[1].uuid;
    let base = crate::plan::dra_names::device_name(g1);
    assert_eq!(unit_of_name(&base, &inv).as_deref(), Some(g1.as_str()));
    assert_eq!(
        unit_of_name(&format!("{base}-r3"), &inv).as_deref(),
        Some(g1.as_str())
    );
    for not_a_replica in [
        format!("{base}-r"),
        format!("{base}-rx"),
        format!("{base}-r1x"),
        format!("{base}x"),
    ] {
        assert_eq!(unit_of_name(&not_a_replica, &inv), None, "{not_a_replica}");
    }
    assert_eq!(unit_of_name("dev-0123abcd", &inv), None);
}

#[test]
fn after_a_restart_a_held_mig_device_is_shaped_from_the_inventory_with_its_health() {
    // Before the restart MIG devices were nvidia.com/gpu (migStrategy single); now GPU 0 is
    // advertised whole. The held MIG device stays, shaped from the inventory, as healthy as it
    // and its GPU are.
    let mut inv = test_node(1);
    inv.gpus[0].mig_enabled = true;
    inv.gpus[0].mig_devices = crate::inventory::test_mig(0, &[("1g.10gb", 2)]);
    let held_mig = inv.gpus[0].mig_devices[1].uuid.clone();
    for (mig_health, want) in [
        (Health::Healthy, Health::Healthy),
        (Health::Unhealthy, Health::Unhealthy),
    ] {
        inv.gpus[0].mig_devices[1].health = mig_health;
        let mut p = build(&policy(0), &inv).unwrap().plan;
        apply(&mut p, &Plan::default(), &held(&[(&held_mig, "a")]), &inv);
        let d = p.resources[GPU]
            .device(&held_mig)
            .unwrap_or_else(|| panic!("{held_mig} not retained: {:?}", p.drain));
        assert_eq!(
            (d.gpu_index, d.gpu_uuid.as_str(), d.health),
            (0, held_mig.as_str(), want)
        );
        assert!(d.mig.is_some());
    }
}

/// After a restart with the same policy, a GPU a device-plugin pod holds is what it was: no
/// drain, still the device plugin's (no plan came before, so only the path pod-resources
/// lists is known, and it is the resource's own).
#[test]
fn after_a_restart_a_device_plugin_gpu_its_pod_holds_stays_as_it_was() {
    let after = plan(0, 2, &Plan::default(), &held(&[(&uuid(0), "a")]));
    assert!(after.drain.is_empty(), "{:?}", after.drain);
    assert!(!after.resources[GPU].dra);
    assert_eq!(
        listed(&after, GPU),
        [(uuid(0), "Healthy"), (uuid(1), "Healthy")]
    );
}

/// After a restart with the same DRA policy, a claim on GPU 0 changes nothing: the resource
/// stays on DRA and nothing drains.
#[test]
fn after_a_restart_a_claim_on_a_dra_resource_changes_nothing() {
    let inv = test_node(2);
    let dra = parse("version: v1\ndra:\n  resources: [nvidia.com/gpu]\n").unwrap();
    let mut p = build(&dra, &inv).unwrap().plan;
    let claim = crate::plan::dra_names::device_name(&uuid(0));
    apply(&mut p, &Plan::default(), &claimed(&[(claim, "a")]), &inv);
    assert!(p.resources[GPU].dra, "{:?}", p.drain);
    assert!(p.drain.is_empty(), "{:?}", p.drain);
}

fn mps(replicas: u32, dra: bool) -> crate::policy::Policy {
    parse(&format!(
        "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n        dra: {dra}\n"
    ))
    .unwrap()
}

fn time_sliced(replicas: u32) -> crate::policy::Policy {
    policy(replicas)
}

/// `before` → `after` on `n` GPUs with `in_use` held, the drain rules applied.
fn replanned(
    before: &crate::policy::Policy,
    after: &crate::policy::Policy,
    n: u32,
    in_use: &InUse,
) -> Plan {
    let inv = test_node(n);
    let previous = build(before, &inv).unwrap().plan;
    let mut p = build(after, &inv).unwrap().plan;
    apply(&mut p, &previous, in_use, &inv);
    p
}

/// MPS to MPS with another replica count while a client holds a replica that stays: the MPS
/// pending-change rule covers it (the daemon keeps its limits until its clients leave), so
/// the drain rules change nothing.
#[test]
fn an_mps_replica_count_change_under_a_holder_drains_nothing() {
    let id = format!("{}::0", uuid(0));
    let p = replanned(&mps(2, false), &mps(4, false), 1, &held(&[(&id, "a")]));
    assert!(p.drain.is_empty(), "{:?}", p.drain);
}

/// MPS to time-slicing while a client holds GPU 0's replica 0: GPU 0's other new replica
/// drains (the MPS exception covers MPS on both sides only).
#[test]
fn mps_to_time_slicing_under_a_holder_drains_its_gpu() {
    let id = format!("{}::0", uuid(0));
    let p = replanned(&mps(2, false), &time_sliced(2), 1, &held(&[(&id, "a")]));
    assert_eq!(
        listed(&p, GPU),
        [
            (id.clone(), "Healthy"),
            (format!("{}::1", uuid(0)), "Unhealthy")
        ]
    );
}

/// An MPS resource moved to DRA (same replicas) while a device-plugin client holds a replica
/// stays on the device plugin until it is gone: the MPS exception does not cover a path change.
#[test]
fn an_mps_resource_moved_to_dra_under_a_holder_stays_on_the_device_plugin() {
    let id = format!("{}::0", uuid(0));
    let p = replanned(&mps(2, false), &mps(2, true), 1, &held(&[(&id, "a")]));
    assert!(!p.resources[GPU].dra, "{:?}", p.drain);
}

/// A drain is empty only when none of its three cases has an entry.
#[test]
fn a_drain_with_any_case_is_not_empty() {
    assert!(crate::plan::Drain::default().is_empty());
    let mut retained = crate::plan::Drain::default();
    retained
        .retained
        .insert("nvidia.com/gpu".into(), ["GPU-0".to_string()].into());
    let mut draining = crate::plan::Drain::default();
    draining.draining.insert(
        "nvidia.com/gpu".into(),
        [("GPU-0".to_string(), "ns/pod".to_string())].into(),
    );
    let mut given = crate::plan::Drain::default();
    given.given.insert(
        "nvidia.com/gpu".into(),
        [("GPU-0".to_string(), (Strategy::None, 1, false))].into(),
    );
    for d in [retained, draining, given] {
        assert!(!d.is_empty(), "{d:?}");
    }
}

/// A GPU whose MIG layout is about to change: its free replicas are offered to nobody, its
/// held one stays advertised Healthy until released, and the other GPU is untouched.
#[test]
fn a_withdrawn_gpu_keeps_only_its_held_devices() {
    let inv = test_node(2);
    let before = plan(2, 2, &Plan::default(), &InUse::default());
    let in_use = held(&[(&format!("{}::1", uuid(0)), "a")]);
    let mut p = build(&policy(2), &inv).unwrap().plan;
    withdraw_gpu(&mut p, 0, &inv);
    apply(&mut p, &before, &in_use, &inv);
    assert_eq!(
        listed(&p, GPU),
        [
            (format!("{}::1", uuid(0)), "Healthy"),
            (format!("{}::0", uuid(1)), "Healthy"),
            (format!("{}::1", uuid(1)), "Healthy"),
        ]
    );
    // Released: nothing of GPU 0 is left.
    let mut p = build(&policy(2), &inv).unwrap().plan;
    withdraw_gpu(&mut p, 0, &inv);
    apply(&mut p, &before, &InUse::default(), &inv);
    assert!(listed(&p, GPU)
        .iter()
        .all(|(id, _)| id.starts_with(&uuid(1))));
    assert_eq!(p.resources[GPU].device(&format!("{}::0", uuid(0))), None);
}

/// A time-slicing entry of `replicas` on every GPU with the extra line `extra` (indented as an
/// entry's key).
fn sliced_with(replicas: u32, extra: &str) -> crate::policy::Policy {
    parse(&format!(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n        {extra}\n"
    ))
    .unwrap()
}

/// A resource rebuilt to keep a held device keeps the new plan's memory limits: without them
/// every later Allocate of the resource would hand out replicas with no limit.
#[test]
fn a_resource_that_keeps_a_held_device_keeps_its_memory_limits() {
    let inv = test_node(2);
    let after = sliced_with(2, "memory: {hard: 20Gi, enforce: best-effort}");
    let raw = build(&after, &inv).unwrap().plan;
    assert!(raw.resources[GPU].memory.is_some());
    let id3 = format!("{}::3", uuid(0));
    let p = replanned(
        &sliced_with(4, "memory: {hard: 10Gi, enforce: best-effort}"),
        &after,
        2,
        &held(&[(&id3, "a")]),
    );
    assert!(p.resources[GPU].device(&id3).is_some(), "retained");
    assert_eq!(p.resources[GPU].memory, raw.resources[GPU].memory);
}

/// The same for a `dra: capacity` resource: kept as one, so DRA still publishes its units with
/// shareable capacity.
#[test]
fn a_capacity_resource_that_keeps_a_held_device_stays_a_capacity_resource() {
    let inv = test_node(2);
    let after = sliced_with(4, "dra: capacity");
    let raw = build(&after, &inv).unwrap().plan;
    assert!(raw.resources[GPU].capacity.is_some());
    let id1 = format!("{}::1", uuid(0));
    let p = replanned(&time_sliced(2), &after, 2, &held(&[(&id1, "a")]));
    assert!(p.resources[GPU].device(&id1).is_some(), "retained");
    assert_eq!(p.resources[GPU].capacity, raw.resources[GPU].capacity);
}
