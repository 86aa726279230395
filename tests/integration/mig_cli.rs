//! `slicelet mig create` and `slicelet mig destroy` on a simulated node with MIG on (the node
//! file copied to a temp dir, its MIG state kept beside it): the new MIG device is discovered
//! with the UUID and ids printed, the refusals name why, and a destroy removes it.

use tokio::process::Command;

use crate::binary::{bin, text};
use crate::common::node_file;

/// Runs `slicelet mig ARGS --simulate NODE`: (success, stdout, stderr).
async fn mig(node: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin())
        .arg("mig")
        .args(args)
        .arg("--simulate")
        .arg(node)
        .output()
        .await
        .unwrap();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// The MIG UUIDs a discovery of the simulated node finds.
fn mig_uuids(node: &std::path::Path) -> Vec<String> {
    let inv = slicelet::inventory::simulated::SimulatedSource::new(node);
    let mut source: Box<dyn slicelet::inventory::GpuSource> = Box::new(inv);
    source
        .discover()
        .unwrap()
        .gpus
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(|m| m.uuid.clone()))
        .collect()
}

#[tokio::test]
async fn mig_create_and_destroy_on_a_simulated_node() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node.yaml");
    std::fs::copy(node_file("h100-80gb-x2-mig-dynamic.yaml"), &node).unwrap();
    assert!(mig_uuids(&node).is_empty());

    let (ok, out, err) = mig(&node, &["create", "--gpu", "0", "--profile", "1g.10gb"]).await;
    assert!(ok, "{err}");
    let uuid = out.split_whitespace().next().unwrap().to_string();
    assert!(uuid.starts_with("MIG-"), "{out}");
    assert!(
        out.trim_end()
            .ends_with("gpu=0 profile=1g.10gb placement=0+1 gi=1 ci=0"),
        "{out}"
    );
    assert_eq!(mig_uuids(&node), [uuid.as_str()]);

    // A placement of the profile's, and the refusals.
    let (ok, out, err) = mig(
        &node,
        &[
            "create",
            "--gpu",
            "0",
            "--profile",
            "3g.40gb",
            "--placement",
            "4",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let second = out.split_whitespace().next().unwrap().to_string();
    assert!(out.contains("placement=4+4"), "{out}");
    for (args, why) in [
        (
            vec![
                "create",
                "--gpu",
                "0",
                "--profile",
                "3g.40gb",
                "--placement",
                "2",
            ],
            "3g.40gb has no placement starting at memory slice 2; its placements start at 0, 4",
        ),
        (
            vec!["create", "--gpu", "1", "--profile", "1g.10gb"],
            "has MIG mode off; slicelet never enables it",
        ),
        (
            vec!["create", "--gpu", "7", "--profile", "1g.10gb"],
            "this node has no GPU 7",
        ),
        (
            vec![
                "create",
                "--gpu",
                "0",
                "--profile",
                "4g.40gb",
                "--placement",
                "0",
            ],
            "Insufficient Resources",
        ),
        (
            vec!["destroy", "--uuid", "MIG-nope"],
            "this node has no MIG device MIG-nope",
        ),
    ] {
        let (ok, _, err) = mig(&node, &args).await;
        assert!(!ok, "{args:?}");
        assert!(err.contains(why), "{args:?}: {err}");
    }

    let (ok, out, err) = mig(&node, &["destroy", "--uuid", &uuid]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim_end(), format!("destroyed {uuid} gpu=0 gi=1 ci=0"));
    assert_eq!(mig_uuids(&node), [second.as_str()]);
    let (ok, _, err) = mig(&node, &["destroy", "--uuid", &second]).await;
    assert!(ok, "{err}");
    assert!(mig_uuids(&node).is_empty());
}
