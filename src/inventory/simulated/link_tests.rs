//! Unit tests of the simulated node's `links` and `nvswitch`.

use super::*;

const FOUR: &str = "gpus:\n  - model: X\n    memoryMiB: 1\n    count: 2\n    numaNode: 0\n  - model: X\n    memoryMiB: 1\n    count: 2\n    numaNode: 1\n";

#[test]
fn links_and_nvswitch_are_read() {
    let text = format!("{FOUR}links:\n  - gpus: [0, 1]\n    nvlinks: 4\n  - gpus: [3, 2]\n    pcie: single\n  - gpus: [0, 2]\n    nvlinks: 2\n    pcie: hostbridge\n");
    let inv = parse(Path::new("n.yaml"), &text).unwrap();
    assert_eq!(
        inv.link(1, 0),
        Link {
            nvlinks: 4,
            nvswitch: false,
            pcie: PathLevel::Node
        }
    );
    assert_eq!(inv.link(2, 3), Link::pcie(PathLevel::Single));
    assert_eq!(inv.link(0, 2).pcie, PathLevel::HostBridge);
    assert_eq!(inv.link(0, 2).nvlinks, 2);
    // Not listed: from numaNode.
    assert_eq!(inv.link(1, 3), Link::pcie(PathLevel::System));
    let inv = parse(Path::new("n.yaml"), &format!("{FOUR}nvswitch: true\n")).unwrap();
    assert!(inv.link(0, 3).nvswitch && inv.link(1, 2).nvswitch);
    assert_eq!(inv.link(0, 1).pcie, PathLevel::Node);
    // Without links, derived from numaNode (and nothing recorded).
    let inv = parse(Path::new("n.yaml"), FOUR).unwrap();
    assert!(inv.links.is_empty());
    assert_eq!(inv.link(0, 1), Link::pcie(PathLevel::Node));
    assert_eq!(inv.link(0, 2), Link::pcie(PathLevel::System));
}

#[test]
fn bad_links_name_their_path() {
    let cases = [
        ("links:\n  - gpus: [0, 4]\n    nvlinks: 1\n", "links[0].gpus: GPU 4 does not exist"),
        ("links:\n  - gpus: [1, 1]\n    nvlinks: 1\n", "links[0].gpus: names GPU 1 twice"),
        ("links:\n  - gpus: [0, 1]\n    nvlinks: 1\n  - gpus: [1, 0]\n    pcie: single\n", "links[1].gpus: GPUs 1 and 0 are listed already in links[0]"),
        ("links:\n  - gpus: [0, 1]\n", "links[0]: needs nvlinks or pcie"),
        ("links:\n  - gpus: [0, 1]\n    nvlinks: 19\n", "links[0].nvlinks: 19 is more than the 18"),
        ("links:\n  - gpus: [0, 1]\n    pcie: pix\n", "links[0].pcie: unknown variant `pix`, expected one of `single`, `multiple`, `hostbridge`"),
        ("links:\n  - gpus: [0, 1, 2]\n    nvlinks: 1\n", "links[0].gpus"),
        ("links:\n  - gpus: [0, 1]\n    nvlink: 1\n", "links[0].nvlink: unknown field `nvlink`"),
        ("nvlink:\n  - gpus: [0, 1]\n", "nvlink: unknown field `nvlink`"),
        ("nvswitch: yes please\n", "nvswitch"),
    ];
    for (extra, want) in cases {
        let e = parse(Path::new("n.yaml"), &format!("{FOUR}{extra}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
}
