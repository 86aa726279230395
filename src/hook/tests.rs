use super::*;

#[test]
fn cgroup_paths_of_both_drivers() {
    let root = Path::new("/sys/fs/cgroup");
    let cases = [
        (
            "/kubepods/burstable/pod1234/abcd",
            "/sys/fs/cgroup/kubepods/burstable/pod1234/abcd",
        ),
        ("relative/ctr", "/sys/fs/cgroup/relative/ctr"),
        (
            "kubepods-burstable-pod1234.slice:cri-containerd:abcd",
            "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-abcd.scope",
        ),
        ("system.slice:runc:x", "/sys/fs/cgroup/system.slice/runc-x.scope"),
        (":crio:abcd", "/sys/fs/cgroup/crio-abcd.scope"),
        ("-.slice:crio:abcd", "/sys/fs/cgroup/crio-abcd.scope"),
    ];
    for (path, want) in cases {
        assert_eq!(
            cgroup_dir(path, root).unwrap(),
            PathBuf::from(want),
            "{path}"
        );
    }
    for bad in [
        "",
        "/",
        "/a/../../etc",
        "a-.slice:p:n",
        "kubepods.slice::n",
        "kubepods.slice:p:",
        "kubepods:p:n",
        "only:two",
    ] {
        assert!(
            matches!(cgroup_dir(bad, root), Err(HookError::Cgroup(_))),
            "{bad:?} accepted"
        );
    }
}
