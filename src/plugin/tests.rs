use super::*;
use crate::device_health::Health;
use crate::inventory::test_node;
use crate::plan::{build, device_encoded_len};
use crate::policy::parse;
use prost::Message;

fn service(
    policy: &str,
    gpus: u32,
    resource: &str,
) -> (Service, watch::Sender<Arc<Plan>>, CancellationToken) {
    let built = build(&parse(policy).unwrap(), &test_node(gpus)).unwrap();
    let (tx, rx) = watch::channel(Arc::new(built.plan));
    let stop = CancellationToken::new();
    (Service::new(resource, rx, stop.clone(), "/"), tx, stop)
}

const SHARED4: &str = "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-shared\n        replicas: 4\n";

#[test]
fn plan_size_arithmetic_matches_prost() {
    let mut node = test_node(8);
    node.gpus[1].numa_node = Some(0);
    node.gpus[2].numa_node = None;
    node.gpus[3].numa_node = Some(-1);
    node.gpus[4].numa_node = Some(300);
    node.gpus[5].health = Health::Unhealthy;
    for replicas in [1u32, 2, 11, 150] {
        let p = parse(&format!("sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n")).unwrap();
        let built = build(&p, &node).unwrap();
        let res = &built.plan.resources["nvidia.com/gpu"];
        let msg = list_response(res);
        for (d, m) in res.devices.iter().zip(&msg.devices) {
            assert_eq!(
                device_encoded_len(d.id.len(), d.health, d.numa_node),
                m.encoded_len() as u64,
                "{}",
                d.id
            );
        }
    }
}

#[tokio::test]
async fn allocate_answers_one_response_per_container_in_order() {
    let (svc, _tx, _stop) = service(SHARED4, 8, "nvidia.com/gpu-shared");
    let node = test_node(8);
    let req = api::AllocateRequest {
        container_requests: vec![
            api::ContainerAllocateRequest {
                devices_ids: vec![format!("{}::1", node.gpus[5].uuid)],
            },
            api::ContainerAllocateRequest {
                devices_ids: vec![
                    format!("{}::0", node.gpus[2].uuid),
                    format!("{}::3", node.gpus[0].uuid),
                ],
            },
        ],
    };
    let resp = svc.allocate(Request::new(req)).await.unwrap().into_inner();
    assert_eq!(resp.container_responses.len(), 2);
    assert_eq!(
        resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
        node.gpus[5].uuid
    );
    assert_eq!(
        resp.container_responses[1].envs["CUDA_VISIBLE_DEVICES"],
        format!("{},{}", node.gpus[0].uuid, node.gpus[2].uuid)
    );
}

#[tokio::test]
async fn allocate_refuses_unknown_ids_with_invalid_argument() {
    let (svc, _tx, _stop) = service(SHARED4, 2, "nvidia.com/gpu-shared");
    let req = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: vec!["GPU-nope::0".into()],
        }],
    };
    let status = svc.allocate(Request::new(req)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("GPU-nope::0"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn options_and_prestart() {
    let (svc, _tx, _stop) = service(SHARED4, 1, "nvidia.com/gpu-shared");
    let o = svc
        .get_device_plugin_options(Request::new(api::Empty {}))
        .await
        .unwrap()
        .into_inner();
    assert!(o.get_preferred_allocation_available);
    assert!(!o.pre_start_required);
    svc.pre_start_container(Request::new(api::PreStartContainerRequest {
        devices_ids: vec![],
    }))
    .await
    .unwrap();
}

#[tokio::test]
async fn preferred_allocation_rejects_negative_size_only() {
    let (svc, _tx, _stop) = service(SHARED4, 2, "nvidia.com/gpu-shared");
    let node = test_node(2);
    let avail: Vec<String> = (0..4)
        .map(|n| format!("{}::{n}", node.gpus[0].uuid))
        .collect();
    let ok = svc
        .get_preferred_allocation(Request::new(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: avail.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.container_responses[0].device_i_ds.len(), 2);
    let bad = svc
        .get_preferred_allocation(Request::new(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: avail,
                must_include_device_i_ds: vec![],
                allocation_size: -1,
            }],
        }))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
}

// Paused clock: a timeout elapses only once every task is idle, that is once the stream's task
// has handled each published plan. So "an unchanged plan sends nothing" is checked without a
// real-time window, and the watch channel cannot coalesce the unchanged plan into the change
// that follows it (which would hide a duplicate).
#[tokio::test(start_paused = true)]
async fn list_and_watch_sends_full_lists_without_duplicates_and_ends_on_stop() {
    use std::time::Duration;
    use tokio_stream::StreamExt;
    let policy4 = SHARED4;
    let policy8 = SHARED4.replace("replicas: 4", "replicas: 8");
    let (svc, tx, stop) = service(policy4, 2, "nvidia.com/gpu-shared");
    let mut stream = svc
        .list_and_watch(Request::new(api::Empty {}))
        .await
        .unwrap()
        .into_inner();
    // Every list the stream sends, in order, by device count.
    let mut sent = Vec::new();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));
    assert_eq!(first.devices[0].topology.as_ref().unwrap().nodes[0].id, 0);
    sent.push(first.devices.len());
    // Publishing an equal plan (a new Arc, then the same Arc again) sends nothing: the stream's
    // task handles each one, then goes idle, and the (virtual) timeout elapses.
    let same = build(&parse(policy4).unwrap(), &test_node(2)).unwrap().plan;
    tx.send_replace(Arc::new(same));
    if let Ok(dup) = tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
        sent.push(dup.unwrap().unwrap().devices.len());
    }
    let again = Arc::clone(&tx.borrow());
    tx.send_replace(again);
    if let Ok(dup) = tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
        sent.push(dup.unwrap().unwrap().devices.len());
    }
    // A changed plan sends the full list.
    let changed = build(&parse(&policy8).unwrap(), &test_node(2))
        .unwrap()
        .plan;
    tx.send_replace(Arc::new(changed));
    let second = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the changed plan must be sent")
        .unwrap()
        .unwrap();
    sent.push(second.devices.len());
    assert_eq!(
        sent,
        [8, 16],
        "the initial list and the change, no duplicate"
    );
    stop.cancel();
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap();
    assert!(end.is_none(), "stream must end on stop");
}

#[test]
fn health_strings_are_the_kubelets() {
    assert_eq!(Health::Healthy.as_str(), api::HEALTHY);
    assert_eq!(Health::Unhealthy.as_str(), api::UNHEALTHY);
}

/// A burst of Allocates wakes the supervisor once; after it rearms, the next Allocate wakes it
/// again (a permit given while nobody waits is kept, so none is lost).
#[tokio::test]
async fn allocated_wakes_once_per_rearm() {
    let (svc, _tx, _stop) = service(SHARED4, 2, "nvidia.com/gpu-shared");
    let allocated = Arc::new(Allocated::default());
    let svc = svc.report_allocations(Arc::clone(&allocated));
    let id = format!("{}::0", test_node(2).gpus[0].uuid);
    let request = || {
        Request::new(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![id.clone()],
            }],
        })
    };
    let wait = std::time::Duration::from_secs(5);
    svc.allocate(request()).await.unwrap();
    tokio::time::timeout(wait, allocated.notified())
        .await
        .expect("the first Allocate notifies");
    // More Allocates before the supervisor rearms: no new notification (a zero timeout polls
    // once).
    svc.allocate(request()).await.unwrap();
    svc.allocate(request()).await.unwrap();
    assert!(
        tokio::time::timeout(std::time::Duration::ZERO, allocated.notified())
            .await
            .is_err(),
        "Allocates before the rearm woke the supervisor again"
    );
    allocated.rearm();
    svc.allocate(request()).await.unwrap();
    tokio::time::timeout(wait, allocated.notified())
        .await
        .expect("an Allocate after rearm notifies again");
}
