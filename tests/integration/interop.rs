//! Every socket slicelet serves, called by gRPC clients that are not tonic, each dialing the way
//! its real counterpart does:
//!
//! - **grpc-go** (`tests/clients/go`, the kubelet's gRPC library, Debian's 1.33): the plain
//!   socket path as the dial target with a unix context dialer, as the kubelet's plugin
//!   watcher dials a registration socket, so `:authority` is the path itself;
//! - **grpc C-core** (`tests/clients/grpcio_client.py`, Python `grpcio`): `unix:<path>` with the
//!   default authority, the percent-encoded path.
//!
//! Each registers with the DRA plugin, prepares and unprepares a claim of two replicas of GPU 0
//! and a share of a consumable-capacity GPU (reading the v1 answer's `share_id`), and makes
//! every DevicePlugin call.
//!
//! Both need their toolchains, so these tests are `#[ignore]`d in the plain `cargo test`;
//! `.ci/interop` installs Go and grpcio, builds the Go client and runs them with
//! `SLICELET_INTEROP_GO` (the client binary) and `SLICELET_INTEROP_PYTHON` (a Python with
//! grpcio and protobuf) set. [`a_path_authority_is_answered_by_every_socket`] needs nothing
//! beside the repository: it writes the frames grpc-go writes, by hand.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kubelet_emulator::kube_api::{AllocatedDevice, KubeApi};
use serde_json::{json, Value};
use slicelet::plan::dra_names::device_name;

use crate::common::{emulator, node_file, uuids, wait_lists, Daemon, Node, WAIT};

const NODE: &str = "node-1";
const DRIVER: &str = "gpu.slicelet.io";
const UID: &str = "5e1f2c3a-0000-4000-8000-00000000c1a1";
/// GPUs 0–3 time-sliced ×4 through DRA; GPUs 4–7 whole through the device plugin.
const POLICY: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-dra\n        devices: [0, 1, 2, 3]\n        replicas: 4\n        dra: true\n";
/// GPU 0 time-sliced through DRA as one consumable-capacity device; GPUs 1–7 whole through
/// the device plugin.
const CAPACITY_POLICY: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0]\n        replicas: 4\n        dra: capacity\n";
const IGNORED: &str = "needs the grpc-go and grpcio clients: .ci/interop builds and runs them";

/// A gRPC client that is not tonic.
#[derive(Debug, Clone, Copy)]
enum Client {
    /// grpc-go, dialing the plain path.
    Go,
    /// grpc C-core, dialing `unix:<path>` with its default authority.
    Grpcio,
}

/// The protos slicelet compiles, for the clients to build their messages from.
fn descriptors() -> &'static Path {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let path = dir.join("descriptors.bin");
        std::fs::write(
            &path,
            include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin")),
        )
        .unwrap();
        path
    })
}

fn env_path(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set ({IGNORED})"))
}

/// Calls `method` on `socket` with `request` through `client`: the answers (JSON with the
/// protos' field names), or the client's error line (`error: CODE: MESSAGE`).
async fn call(
    client: Client,
    socket: &Path,
    method: &str,
    request: &Value,
    messages: usize,
) -> Result<Vec<Value>, String> {
    let mut cmd = match client {
        Client::Go => {
            let mut c = tokio::process::Command::new(env_path("SLICELET_INTEROP_GO"));
            c.arg("-socket")
                .arg(socket)
                .arg("-descriptors")
                .arg(descriptors())
                .args(["-method", method, "-request", &request.to_string()])
                .args(["-messages", &messages.to_string()]);
            c
        }
        Client::Grpcio => {
            let mut c = tokio::process::Command::new(env_path("SLICELET_INTEROP_PYTHON"));
            c.arg(crate::common::repo().join("tests/clients/grpcio_client.py"))
                .arg("--socket")
                .arg(socket)
                .arg("--descriptors")
                .arg(descriptors())
                .args(["--method", method, "--request", &request.to_string()])
                .args(["--messages", &messages.to_string()]);
            c
        }
    };
    let out = tokio::time::timeout(WAIT, cmd.kill_on_drop(true).output())
        .await
        .unwrap_or_else(|_| panic!("{client:?} {method}: no answer within {WAIT:?}"))
        .unwrap_or_else(|e| panic!("{client:?}: {e}"));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect())
}

async fn one(client: Client, socket: &Path, method: &str, request: Value) -> Value {
    match call(client, socket, method, &request, 1).await {
        Ok(mut v) => v.remove(0),
        Err(e) => panic!("{client:?} {method} on {}: {e}", socket.display()),
    }
}

/// The whole daemon with `--dra` on a simulated 8× H100 node, the kubelet emulator and the
/// Kubernetes API emulator.
struct Setup {
    node: Node,
    api: KubeApi,
    daemon: Daemon,
    uuids: Vec<String>,
    _kubelet: kubelet_emulator::KubeletEmulator,
}

impl Setup {
    async fn start() -> Setup {
        Setup::with(POLICY, 4, 16).await
    }

    /// The daemon on `policy`: ready once the device plugin lists `whole` GPUs and the API
    /// holds `dra` devices.
    async fn with(policy: &str, whole: usize, dra: usize) -> Setup {
        let node = Node::new(policy);
        let sim = node_file("h100-80gb-x8.yaml");
        let api = KubeApi::start(NODE, &[]).await;
        let kubelet = emulator(&node).await;
        let mut settings = node.settings(&sim);
        settings.dra = Some(crate::dra::daemon_dra(&node, &api));
        let daemon = Daemon::start(settings);
        wait_lists(&kubelet, &[("nvidia.com/gpu", whole)]).await;
        api.wait_slices(|s| {
            s.iter()
                .map(|x| x["spec"]["devices"].as_array().map_or(0, Vec::len))
                .sum::<usize>()
                == dra
        })
        .await;
        Setup {
            uuids: uuids(&sim),
            node,
            api,
            daemon,
            _kubelet: kubelet,
        }
    }

    fn registration(&self) -> PathBuf {
        self.node
            .tmp
            .path()
            .join(format!("plugins_registry/{DRIVER}-reg.sock"))
    }

    fn device_plugin(&self) -> PathBuf {
        self.node.plugins().join("slicelet-nvidia.com_gpu.sock")
    }

    /// A claim allocated two replicas of GPU 0; their DRA device names.
    fn claim_two_replicas_of_gpu0(&self) -> [String; 2] {
        let g0 = &self.uuids[0];
        let names = [0, 1].map(|n| device_name(&format!("{g0}::{n}")));
        let devices: Vec<AllocatedDevice> = names
            .iter()
            .map(|d| AllocatedDevice {
                request: "gpu".to_string(),
                driver: DRIVER.to_string(),
                pool: NODE.to_string(),
                device: d.clone(),
                ..AllocatedDevice::default()
            })
            .collect();
        self.api.set_claim("ns", "two", UID, &devices);
        names
    }
}

/// The kubelet's registration handshake: GetInfo on the registration socket (the kubelet then
/// dials the endpoint), NotifyRegistrationStatus(registered). Returns the endpoint.
async fn register(client: Client, reg: &Path) -> PathBuf {
    let info = one(
        client,
        reg,
        "/pluginregistration.Registration/GetInfo",
        json!({}),
    )
    .await;
    assert_eq!(info["type"], "DRAPlugin", "{client:?}: {info}");
    assert_eq!(info["name"], DRIVER, "{client:?}: {info}");
    assert_eq!(
        info["supported_versions"],
        json!([
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]),
        "{client:?}: {info}"
    );
    let endpoint = PathBuf::from(info["endpoint"].as_str().unwrap());
    let notified = one(
        client,
        reg,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        json!({"plugin_registered": true}),
    )
    .await;
    assert_eq!(notified, json!({}), "{client:?}");
    endpoint
}

/// The kubelet's health stream in `version` (`v1` or `v1alpha1`): its first message lists
/// the pool's 16 devices, each HEALTHY with the 60 s timeout.
async fn health_stream(client: Client, endpoint: &Path, version: &str, want: &[String]) {
    let method = format!("/{version}.DRAResourceHealth/NodeWatchResources");
    let first = one(client, endpoint, &method, json!({})).await;
    let devices = first["devices"]
        .as_array()
        .unwrap_or_else(|| panic!("{client:?} {version}: {first}"));
    let mut names: Vec<&str> = devices
        .iter()
        .map(|d| d["device"]["device_name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    let mut want: Vec<&str> = want.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(names, want, "{client:?} {version}");
    for d in devices {
        assert_eq!(d["device"]["pool_name"], NODE, "{client:?} {version}: {d}");
        assert_eq!(d["health"], "HEALTHY", "{client:?} {version}: {d}");
        // int64 is a JSON string in both clients' protobuf JSON.
        assert_eq!(
            d["health_check_timeout_seconds"]
                .to_string()
                .trim_matches('"'),
            "60",
            "{client:?} {version}: {d}"
        );
        assert!(
            d["last_updated_time"]
                .to_string()
                .trim_matches('"')
                .parse::<i64>()
                .is_ok_and(|t| t > 1_700_000_000),
            "{client:?} {version}: {d}"
        );
    }
}

/// Registration, the health stream in both versions, a claim prepared into its CDI ID in both
/// API versions, unprepared, and the handshake again as after a kubelet restart.
/// `NodePrepareResources` of DRA API `version` for `claims` through `client`: the answer for
/// claim [`UID`], which must carry no error.
async fn prepare(client: Client, endpoint: &Path, version: &str, claims: &Value) -> Value {
    let method = format!("/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources");
    let prepared = one(client, endpoint, &method, claims.clone()).await;
    let answer = prepared["claims"][UID].clone();
    assert!(
        answer.get("error").is_none(),
        "{client:?} {version}: {answer}"
    );
    answer
}

async fn dra_end_to_end(client: Client) {
    let s = Setup::start().await;
    let devices = s.claim_two_replicas_of_gpu0();
    let endpoint = register(client, &s.registration()).await;
    let pool: Vec<String> = s.uuids[..4]
        .iter()
        .flat_map(|g| (0..4).map(move |n| device_name(&format!("{g}::{n}"))))
        .collect();
    for version in ["v1", "v1alpha1"] {
        health_stream(client, &endpoint, version, &pool).await;
    }
    let claims = json!({"claims": [{"namespace": "ns", "name": "two", "uid": UID}]});
    for version in ["v1", "v1beta1"] {
        let answer = &prepare(client, &endpoint, version, &claims).await;
        let got: Vec<&str> = answer["devices"]
            .as_array()
            .unwrap_or_else(|| panic!("{client:?} {version}: {answer}"))
            .iter()
            .map(|d| d["device_name"].as_str().unwrap())
            .collect();
        assert_eq!(
            got,
            [devices[0].as_str(), devices[1].as_str()],
            "{client:?}"
        );
        // The claim's one CDI ID (its spec holds both replicas' edits), on the first device.
        let mut cdi = Vec::new();
        for d in answer["devices"].as_array().unwrap() {
            assert_eq!(d["pool_name"], NODE);
            assert_eq!(d["request_names"], json!(["gpu"]));
            cdi.extend(
                d["cdi_device_ids"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
        }
        assert_eq!(
            cdi,
            [json!(format!("{DRIVER}/claim={UID}"))],
            "{client:?} {version}: {answer}"
        );
    }
    let spec = s
        .node
        .tmp
        .path()
        .join(format!("cdi/{DRIVER}-claim_{UID}.json"));
    assert!(spec.exists(), "{}", spec.display());
    for version in ["v1", "v1beta1"] {
        let service = format!("/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin");
        let un = one(
            client,
            &endpoint,
            &format!("{service}/NodeUnprepareResources"),
            claims.clone(),
        )
        .await;
        assert_eq!(un["claims"][UID], json!({}), "{client:?} {version}: {un}");
        assert!(!spec.exists());
    }
    // The kubelet restarts: its plugin watcher finds the socket again and repeats the handshake.
    assert_eq!(register(client, &s.registration()).await, endpoint);
    let again = one(
        client,
        &endpoint,
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        claims,
    )
    .await;
    assert_eq!(again["claims"][UID]["devices"].as_array().unwrap().len(), 2);
    s.daemon.stop().await;
}

/// A share of a consumable-capacity device (`dra: capacity`): a claim on GPU 0 with
/// `consumedCapacity` (20 GiB, 25 % of the cores) and a `shareID` is prepared in v1 with the
/// share ID on its device and the share's memory in its CDI spec; v1beta1, which has no share
/// IDs, answers the same device without one.
async fn dra_capacity_share(client: Client) {
    const SHARE: &str = "4c0a7e1b-0000-4000-8000-0000000005e1";
    let s = Setup::with(CAPACITY_POLICY, 7, 1).await;
    let gpu0 = device_name(&s.uuids[0]);
    s.api.set_claim(
        "ns",
        "share",
        UID,
        &[AllocatedDevice {
            request: "gpu".to_string(),
            driver: DRIVER.to_string(),
            pool: NODE.to_string(),
            device: gpu0.clone(),
            consumed_capacity: vec![
                ("memory".to_string(), "20Gi".to_string()),
                ("cores".to_string(), "25".to_string()),
            ],
            share_id: Some(SHARE.to_string()),
        }],
    );
    let endpoint = register(client, &s.registration()).await;
    let claims = json!({"claims": [{"namespace": "ns", "name": "share", "uid": UID}]});
    for (version, share_id) in [("v1", json!(SHARE)), ("v1beta1", Value::Null)] {
        let answer = &prepare(client, &endpoint, version, &claims).await;
        let devices = answer["devices"]
            .as_array()
            .unwrap_or_else(|| panic!("{client:?} {version}: {answer}"));
        assert_eq!(devices.len(), 1, "{client:?} {version}: {answer}");
        assert_eq!(
            devices[0]["device_name"],
            json!(gpu0),
            "{client:?} {version}"
        );
        assert_eq!(
            devices[0].get("share_id").cloned().unwrap_or(Value::Null),
            share_id,
            "{client:?} {version}: {answer}"
        );
    }
    let spec = s
        .node
        .tmp
        .path()
        .join(format!("cdi/{DRIVER}-claim_{UID}.json"));
    let spec: Value = serde_json::from_str(&crate::common::read(&spec)).unwrap();
    let env = &spec["devices"][0]["containerEdits"]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .contains(&json!("SLICELET_GPU_SHARE_MEMORY_MIB=20480")),
        "{client:?}: {env}"
    );
    let un = one(
        client,
        &endpoint,
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        claims,
    )
    .await;
    assert_eq!(un["claims"][UID], json!({}), "{client:?}: {un}");
    s.daemon.stop().await;
}

/// Every DevicePlugin RPC the kubelet makes, on the device-plugin socket.
async fn device_plugin_rpcs(client: Client) {
    let s = Setup::start().await;
    let sock = s.device_plugin();
    let options = one(
        client,
        &sock,
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        json!({}),
    )
    .await;
    assert_eq!(
        options["get_preferred_allocation_available"], true,
        "{client:?}: {options}"
    );
    let lists = call(
        client,
        &sock,
        "/v1beta1.DevicePlugin/ListAndWatch",
        &json!({}),
        1,
    )
    .await
    .unwrap_or_else(|e| panic!("{client:?} ListAndWatch: {e}"));
    let ids: Vec<&str> = lists[0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["ID"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        s.uuids[4..].iter().map(String::as_str).collect::<Vec<_>>()
    );
    let preferred = one(
        client,
        &sock,
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        json!({"container_requests": [{"available_deviceIDs": ids, "allocation_size": 1}]}),
    )
    .await;
    let pick = preferred["container_responses"][0]["deviceIDs"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{client:?}: {preferred}"))
        .to_string();
    assert!(ids.contains(&pick.as_str()));
    let allocated = one(
        client,
        &sock,
        "/v1beta1.DevicePlugin/Allocate",
        json!({"container_requests": [{"devices_ids": [pick]}]}),
    )
    .await;
    assert_eq!(
        allocated["container_responses"][0]["envs"]["NVIDIA_VISIBLE_DEVICES"], pick,
        "{client:?}: {allocated}"
    );
    s.daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the grpc-go and grpcio clients: .ci/interop builds and runs them"]
async fn grpc_go_registers_prepares_and_unprepares_a_dra_claim() {
    dra_end_to_end(Client::Go).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the grpc-go and grpcio clients: .ci/interop builds and runs them"]
async fn grpcio_registers_prepares_and_unprepares_a_dra_claim() {
    dra_end_to_end(Client::Grpcio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the grpc-go and grpcio clients: .ci/interop builds and runs them"]
async fn grpc_go_prepares_a_consumable_capacity_share_with_its_share_id() {
    dra_capacity_share(Client::Go).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the grpc-go and grpcio clients: .ci/interop builds and runs them"]
async fn grpcio_prepares_a_consumable_capacity_share_with_its_share_id() {
    dra_capacity_share(Client::Grpcio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the grpc-go and grpcio clients: .ci/interop builds and runs them"]
async fn grpc_go_gets_every_device_plugin_answer() {
    device_plugin_rpcs(Client::Go).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the grpc-go and grpcio clients: .ci/interop builds and runs them"]
async fn grpcio_gets_every_device_plugin_answer() {
    device_plugin_rpcs(Client::Grpcio).await;
}

/// What grpc-go 1.33 writes for a unary call with the socket path as `:authority`, by hand:
/// the preface, an empty SETTINGS, the request's HEADERS (HPACK literals) and one DATA frame
/// holding `message` (already protobuf-encoded). Returns the response's header fields in order
/// (headers, then trailers), or the RST_STREAM error code.
async fn raw_call(
    socket: &Path,
    authority: &str,
    path: &str,
    message: &[u8],
) -> Result<Vec<(String, String)>, u32> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    fn field(block: &mut Vec<u8>, name: &str, value: &str) {
        block.push(0);
        for s in [name, value] {
            assert!(s.len() < 127);
            block.push(s.len() as u8);
            block.extend_from_slice(s.as_bytes());
        }
    }
    fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = payload.len();
        out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
    }
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.33.3"),
        ("te", "trailers"),
    ] {
        field(&mut block, n, v);
    }
    let mut data = vec![0];
    data.extend_from_slice(&(message.len() as u32).to_be_bytes());
    data.extend_from_slice(message);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frame(&mut out, 0x4, 0, 0, &[]);
    frame(&mut out, 0x1, 0x4, 1, &block);
    frame(&mut out, 0x0, 0x1, 1, &data);
    let mut io = tokio::net::UnixStream::connect(socket).await.unwrap();
    io.write_all(&out).await.unwrap();
    let mut decoder = loona_hpack::Decoder::new();
    let mut fields = Vec::new();
    let mut header = [0u8; 9];
    loop {
        io.read_exact(&mut header).await.expect("connection closed");
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let mut payload = vec![0; len];
        io.read_exact(&mut payload).await.unwrap();
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
        match (header[3], stream) {
            (0x1, 1) => {
                for (n, v) in decoder.decode(&payload).unwrap() {
                    fields.push((String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()));
                }
                if header[4] & 0x1 != 0 {
                    return Ok(fields);
                }
            }
            (0x3, 1) => {
                return Err(u32::from_be_bytes([
                    payload[0], payload[1], payload[2], payload[3],
                ]))
            }
            _ => {}
        }
    }
}

/// The device-plugin socket, the DRA registration socket and the DRA service each answer a
/// request whose `:authority` is the socket path (grpc-go's plain-path dial), its
/// percent-encoded form (grpc C-core) or empty, and `localhost` as before. Without the
/// rewrite (crate::authority) h2 resets every such stream with PROTOCOL_ERROR (code 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_authority_is_answered_by_every_socket() {
    let s = Setup::start().await;
    let endpoint = s
        .node
        .tmp
        .path()
        .join(format!("dra-plugins/{DRIVER}/dra.sock"));
    let sockets = [
        (s.registration(), "/pluginregistration.Registration/GetInfo"),
        (
            endpoint,
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        ),
        (
            s.device_plugin(),
            "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        ),
    ];
    for (socket, method) in &sockets {
        let path = socket.to_str().unwrap();
        let encoded = path.replace('/', "%2F");
        for authority in [path, encoded.as_str(), "", "localhost"] {
            let fields = raw_call(socket, authority, method, &[])
                .await
                .unwrap_or_else(|code| {
                    panic!("{method} with :authority {authority:?}: RST_STREAM code {code}")
                });
            assert!(
                fields.contains(&(":status".to_string(), "200".to_string())),
                "{method} {authority:?}: {fields:?}"
            );
            assert!(
                fields.contains(&("grpc-status".to_string(), "0".to_string())),
                "{method} {authority:?}: {fields:?}"
            );
        }
    }
    s.daemon.stop().await;
}
