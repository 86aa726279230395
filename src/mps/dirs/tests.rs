use std::os::unix::fs::PermissionsExt as _;

use super::*;
use crate::plan::mps_dirs;

const UUID: &str = "GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416";

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn join_under_takes_one_plain_component() {
    let root = Path::new("/run/nvidia/mps");
    assert_eq!(join_under(root, UUID).unwrap(), root.join(UUID));
    for bad in [
        "",
        ".",
        "..",
        "a/b",
        "/etc",
        "GPU-/../../victim3",
        "a\0b",
        "../x",
    ] {
        assert!(join_under(root, bad).is_err(), "{bad:?}");
    }
}

#[test]
fn creates_and_removes_the_directories() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    let d = mps_dirs(&root, UUID);
    create(&d).unwrap();
    assert_eq!(mode(&d.pipe), 0o755);
    assert_eq!(mode(&d.log), 0o755);
    assert_eq!(mode(&d.shm), 0o1777);
    create(&d).unwrap();
    assert!(remove(&d).unwrap());
    assert!(!d.base.exists() && d.shm.exists());
    assert!(!remove(&d).unwrap());
}

#[test]
fn a_shm_symlink_is_refused_without_touching_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    std::fs::create_dir(&root).unwrap();
    let target = dir.path().join("victim");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&target, root.join("shm")).unwrap();
    let d = mps_dirs(&root, UUID);
    let e = create(&d).unwrap_err();
    assert!(
        matches!(
            e,
            DirError::NotADirectory {
                kind: "symlink",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("shm is a symlink"), "{e}");
    assert_eq!(mode(&target), 0o700, "the target was chmodded");
}

#[test]
fn a_symlinked_gpu_directory_is_neither_filled_nor_removed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    std::fs::create_dir(&root).unwrap();
    let victim = dir.path().join("victim3");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("precious"), "x").unwrap();
    std::os::unix::fs::symlink(&victim, root.join(UUID)).unwrap();
    let d = mps_dirs(&root, UUID);
    assert!(matches!(create(&d), Err(DirError::NotADirectory { .. })));
    assert!(matches!(remove(&d), Err(DirError::NotADirectory { .. })));
    assert!(victim.join("precious").exists() && !victim.join("pipe").exists());
}

#[test]
fn a_traversing_uuid_never_reaches_the_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("a/b/mps");
    let d = mps_dirs(&root, "GPU-/../../victim3");
    assert!(matches!(create(&d), Err(DirError::Escapes { .. })));
    assert!(matches!(remove(&d), Err(DirError::Escapes { .. })));
    assert!(!dir.path().join("a").exists());
}

#[test]
fn mps_root_must_be_a_normalised_directory_of_its_own() {
    for bad in [
        "/",
        "/etc",
        "/etc/mps",
        "/proc/self",
        "/sys/x",
        "/dev/shm",
        "/run/../etc",
        "/run/./mps",
        "/run//mps",
        "/run/mps/",
        "/run/mps\u{0}x",
        "run/mps",
    ] {
        let text = format!("flags:\n  mpsRoot: \"{}\"\n", bad.replace('\0', "\\0"));
        let e = crate::policy::parse(&text).unwrap_err();
        assert_eq!(e.path, "flags.mpsRoot", "{bad:?}: {e}");
    }
    for ok in [
        "/run/nvidia/mps",
        "/var/lib/mps",
        "/etcetera/mps",
        "/tmp/x.y/mps",
    ] {
        let p = crate::policy::parse(&format!("flags:\n  mpsRoot: {ok}\n")).unwrap();
        assert_eq!(p.mps_root, Path::new(ok));
    }
}
