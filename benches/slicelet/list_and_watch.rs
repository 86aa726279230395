//! 3. ListAndWatch: plan change -> full 2,688-device list received over the socket.

use std::sync::Arc;
use std::time::Instant;

use slicelet::api::{self, device_plugin_client::DevicePluginClient};
use slicelet::plan;
use slicelet::{kubelet, plugin};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::harness::*;

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, mig: &MigNode, table: &mut Table) {
    let scale = b.scale;
    let tmp = &b.tmp;
    let server_rt = &b.server_rt;
    let client_rt = &b.client_rt;
    let MigNode {
        policy: big_policy,
        node: big_node,
        plan: big,
        res: big_res,
    } = mig;
    let bytes = prost::Message::encoded_len(&plugin::list_response(big_res));
    let dir = tmp.path().join("law");
    std::fs::create_dir_all(&dir).unwrap();
    let (tx, rx) = watch::channel(Arc::new(big.clone()));
    let stop = CancellationToken::new();
    let socket = server_rt
        .block_on(async { plugin::bind(&dir, MIG_RESOURCE) })
        .unwrap();
    let path = socket.path.clone();
    let svc = plugin::Service::new(MIG_RESOURCE, rx, stop.clone(), "/");
    let _srv = {
        let _guard = server_rt.enter();
        plugin::serve(socket, svc, stop.clone())
    };
    let mut h = hist();
    client_rt.block_on(async {
        let mut client = DevicePluginClient::new(kubelet::connect(&path).await.unwrap())
            .max_decoding_message_size(api::KUBELET_MAX_MESSAGE_BYTES);
        let mut stream = client
            .list_and_watch(api::Empty {})
            .await
            .unwrap()
            .into_inner();
        stream.message().await.unwrap().unwrap();
        let mut node = big_node.clone();
        for i in 0..(200 / scale) {
            let was = node.gpus[i % 8].health;
            node.gpus[i % 8].health = slicelet::device_health::Health::from_bool(!was.is_healthy());
            let next = plan::build(big_policy, &node).unwrap().plan;
            let t = Instant::now();
            tx.send_replace(Arc::new(next));
            let msg = stream.message().await.unwrap().unwrap();
            h.record(t.elapsed().as_nanos() as u64).unwrap();
            assert_eq!(msg.devices.len(), 2688);
        }
    });
    stop.cancel();
    table.row(
        "3. ListAndWatch, 2,688 devices: change -> client has list",
        format!(
            "p50 {:.0} us, p99 {:.0} us",
            us(h.value_at_quantile(0.5)),
            us(h.value_at_quantile(0.99))
        ),
        "",
        None,
    );
    table.row(
        "3. ListAndWatch message size, 2,688 devices",
        format!(
            "{bytes} bytes ({:.1}% of 4 MiB)",
            bytes as f64 * 100.0 / api::KUBELET_MAX_MESSAGE_BYTES as f64
        ),
        "far below 4 MiB",
        Some(bytes * 10 < api::KUBELET_MAX_MESSAGE_BYTES),
    );
}
