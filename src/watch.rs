//! File-system events → typed events on a tokio channel (the only user of notify).
//!
//! Directories are watched, not files: a mounted ConfigMap updates by swapping its `..data`
//! symlink (no event names the policy file), and the kubelet wipes the device-plugin directory
//! and creates a new `kubelet.sock` when it restarts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex};

use notify::event::{EventKind, ModifyKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::Notify;

use crate::api::KUBELET_SOCKET;

/// What changed since the supervisor last looked: one flag per kind of change. File-system
/// events are hints ("look again"), so repeats coalesce: the inbox is bounded by construction
/// and never blocks notify's thread, and no kind of change is lost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// Something in the policy file's directory changed (debounce and re-read).
    pub policy: bool,
    /// The ConfigMap volume's `..data` symlink was swapped: the kubelet's atomic writer
    /// committed a new generation, so the new policy is complete and can be read at once.
    pub policy_commit: bool,
    /// The policy file's directory itself was replaced (renamed away and created anew): the
    /// watches must be re-attached to the new directory.
    pub policy_dir_replaced: bool,
    /// Something in the simulated node file's directory changed (debounce and re-read).
    pub node: bool,
    /// `kubelet.sock` was created: a kubelet (re)started.
    pub kubelet: bool,
    /// A `slicelet-*.sock` file was removed (by the kubelet wiping the directory, or by hand).
    pub plugin_removed: bool,
    /// The MIG layouts file (`--mig-config-file`) or its ConfigMap volume changed: read it
    /// again.
    pub mig_layouts: bool,
}

impl Pending {
    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        *self == Pending::default()
    }
}

/// Where watches deliver [`Pending`] changes; cloned into each watch.
#[derive(Debug, Clone, Default)]
pub struct Inbox {
    pending: Arc<Mutex<Pending>>,
    notify: Arc<Notify>,
}

impl Inbox {
    /// Records a change and wakes the supervisor (a wake-up is kept if nobody waits yet).
    pub fn mark(&self, f: impl FnOnce(&mut Pending)) {
        if let Ok(mut p) = self.pending.lock() {
            f(&mut p);
        }
        self.notify.notify_one();
    }

    /// Takes every pending change, leaving none.
    pub fn take(&self) -> Pending {
        self.pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }

    /// Waits until something is marked (returns at once if something was marked since the last
    /// wait).
    pub async fn changed(&self) {
        self.notify.notified().await;
    }
}

/// Watching a directory failed.
#[derive(Debug, thiserror::Error)]
#[error("watching {path}")]
pub struct WatchError {
    /// The directory.
    pub path: PathBuf,
    /// notify's error.
    #[source]
    pub source: notify::Error,
}

/// Keeps the watches alive; dropping it stops them.
pub struct Watches {
    _watchers: Vec<RecommendedWatcher>,
}

impl Watches {
    /// These watches and `other`'s, kept alive together.
    pub fn with(mut self, other: Watches) -> Watches {
        self._watchers.extend(other._watchers);
        self
    }
}

fn watch_dir(
    dir: &Path,
    handler: impl Fn(notify::Event) + Send + 'static,
) -> Result<RecommendedWatcher, WatchError> {
    let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Ok(ev) = res {
            handler(ev);
        }
    })
    .map_err(|source| WatchError {
        path: dir.to_path_buf(),
        source,
    })?;
    w.watch(dir, RecursiveMode::NonRecursive)
        .map_err(|source| WatchError {
            path: dir.to_path_buf(),
            source,
        })?;
    Ok(w)
}

fn parent(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Watches the policy file's parent directory, the device-plugin directory and, for a
/// simulated node, the node file's directory, marking changes in `inbox`. Access events are
/// ignored.
///
/// # Errors
/// [`WatchError`] when a directory cannot be watched (e.g. it does not exist).
pub fn start(
    policy_file: &Path,
    device_plugin_dir: &Path,
    node_file: Option<&Path>,
    inbox: &Inbox,
) -> Result<Watches, WatchError> {
    let mut watches = start_policy(policy_file, node_file, inbox)?;
    let tx = inbox.clone();
    watches
        ._watchers
        .push(watch_dir(device_plugin_dir, move |ev| {
            for path in &ev.paths {
                let Some(name) = path.file_name() else {
                    continue;
                };
                match ev.kind {
                    EventKind::Create(_) if name == KUBELET_SOCKET => {
                        tx.mark(|p| p.kubelet = true);
                    }
                    EventKind::Remove(_) if name.to_string_lossy().starts_with("slicelet-") => {
                        tx.mark(|p| p.plugin_removed = true);
                    }
                    _ => {}
                }
            }
        })?);
    Ok(watches)
}

/// Whether an event in a watched file's directory can change that file: not an access, and
/// about the file itself or a `..`-prefixed entry (a ConfigMap volume swaps `..data`, so no
/// event names the file). Other files in the directory (a log written next to the policy,
/// say) are ignored, so writing them cannot make slicelet re-read in a loop.
fn concerns(ev: &notify::Event, file: Option<&std::ffi::OsStr>) -> bool {
    if matches!(ev.kind, EventKind::Access(_)) {
        return false;
    }
    ev.paths.is_empty()
        || ev.paths.iter().any(|p| {
            p.file_name()
                .is_some_and(|n| Some(n) == file || n.to_string_lossy().starts_with(".."))
        })
}

/// Whether an event is the kubelet's atomic writer committing a ConfigMap volume update: the
/// `..data` symlink renamed into place (or created, the first time).
fn commits(ev: &notify::Event) -> bool {
    matches!(
        ev.kind,
        EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(_))
    ) && ev
        .paths
        .iter()
        .any(|p| p.file_name().is_some_and(|n| n == "..data"))
}

/// When `file` is a symlink to a file in another directory (a policy kept elsewhere and linked
/// into place, edited in place there), watches that directory too, for the target's name: an
/// edit of the target raises no event in the link's own directory. A ConfigMap volume's links
/// (`config.yaml -> ..data/config.yaml`) stay inside the volume and need no extra watch; the
/// target is resolved when the watches are (re-)attached. Best effort: `None` when `file` is no
/// symlink or its target cannot be resolved or watched.
fn watch_link_target(
    file: &Path,
    inbox: &Inbox,
    mark: fn(&mut Pending),
) -> Option<RecommendedWatcher> {
    if !std::fs::symlink_metadata(file)
        .ok()?
        .file_type()
        .is_symlink()
    {
        return None;
    }
    let target = std::fs::canonicalize(file).ok()?;
    let own_dir = std::fs::canonicalize(parent(file)).ok()?;
    let target_dir = target.parent()?.to_path_buf();
    if target_dir.starts_with(&own_dir) {
        return None;
    }
    let name = target.file_name().map(OsString::from);
    let tx = inbox.clone();
    watch_dir(&target_dir, move |ev| {
        if concerns(&ev, name.as_deref()) {
            tx.mark(mark);
        }
    })
    .ok()
}

/// Watches the policy file's parent directory and, for a simulated node, the node file's
/// directory (`slicelet mps`, which has no kubelet), and the directory of a symlink's target
/// when the file is a symlink to elsewhere.
///
/// # Errors
/// [`WatchError`] when a directory cannot be watched.
pub fn start_policy(
    policy_file: &Path,
    node_file: Option<&Path>,
    inbox: &Inbox,
) -> Result<Watches, WatchError> {
    let tx = inbox;
    let mut watchers = Vec::new();
    // The directory's parent, for the directory itself being replaced (an inotify watch
    // follows the old directory, not the path). Best effort: `/` has no parent to watch.
    // A directory of named configs (a ConfigMap mounted whole) is watched itself, and every
    // entry in it concerns the policy (any key may be the chosen one).
    let config_dir = crate::policy::select::is_config_dir(policy_file);
    let dir = if config_dir {
        policy_file.to_path_buf()
    } else {
        parent(policy_file)
    };
    if let (Some(grand), Some(dir_name)) = (dir.parent(), dir.file_name()) {
        let dir_name = dir_name.to_os_string();
        let gtx = tx.clone();
        let grand = if grand.as_os_str().is_empty() {
            Path::new(".")
        } else {
            grand
        };
        if let Ok(w) = watch_dir(grand, move |ev| {
            let created = matches!(
                ev.kind,
                EventKind::Create(_) | EventKind::Modify(notify::event::ModifyKind::Name(_))
            );
            if created
                && ev
                    .paths
                    .iter()
                    .any(|p| p.file_name() == Some(dir_name.as_os_str()))
            {
                gtx.mark(|p| p.policy_dir_replaced = true);
            }
        }) {
            watchers.push(w);
        }
    }
    if !config_dir {
        if let Some(w) = watch_link_target(policy_file, inbox, |p| p.policy = true) {
            watchers.push(w);
        }
    }
    let ptx = tx.clone();
    let policy_name = policy_file.file_name().map(OsString::from);
    watchers.push(watch_dir(&dir, move |ev| {
        if commits(&ev) {
            ptx.mark(|p| p.policy_commit = true);
        } else if (config_dir && !matches!(ev.kind, EventKind::Access(_)))
            || concerns(&ev, policy_name.as_deref())
        {
            ptx.mark(|p| p.policy = true);
        }
    })?);
    if let Some(node) = node_file {
        if let Some(w) = watch_link_target(node, inbox, |p| p.node = true) {
            watchers.push(w);
        }
        let ntx = tx.clone();
        let node_name = node.file_name().map(OsString::from);
        watchers.push(watch_dir(&parent(node), move |ev| {
            if concerns(&ev, node_name.as_deref()) {
                ntx.mark(|p| p.node = true);
            }
        })?);
    }
    Ok(Watches {
        _watchers: watchers,
    })
}

/// Watches one more file the way the policy file is watched: its directory (an event about
/// the file, or a ConfigMap volume's `..data` swap), and its target's directory when it is a
/// symlink to elsewhere, marking `mark` in `inbox` (the MIG layouts file, `--mig-config-file`).
///
/// # Errors
/// [`WatchError`] when the file's directory cannot be watched.
pub fn start_file(
    file: &Path,
    inbox: &Inbox,
    mark: fn(&mut Pending),
) -> Result<Watches, WatchError> {
    let mut watchers = Vec::new();
    if let Some(w) = watch_link_target(file, inbox, mark) {
        watchers.push(w);
    }
    let tx = inbox.clone();
    let name = file.file_name().map(OsString::from);
    watchers.push(watch_dir(&parent(file), move |ev| {
        if commits(&ev) || concerns(&ev, name.as_deref()) {
            tx.mark(mark);
        }
    })?);
    Ok(Watches {
        _watchers: watchers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, RenameMode};

    fn ev(kind: EventKind, paths: &[&str]) -> notify::Event {
        let mut e = notify::Event::new(kind);
        for p in paths {
            e = e.add_path(PathBuf::from(p));
        }
        e
    }

    #[tokio::test]
    async fn an_in_place_edit_of_a_symlinked_policy_is_seen() {
        let tmp = tempfile::tempdir().unwrap();
        let (etc, elsewhere) = (tmp.path().join("etc"), tmp.path().join("elsewhere"));
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("real.yaml"), "version: v1\n").unwrap();
        std::os::unix::fs::symlink(elsewhere.join("real.yaml"), etc.join("config.yaml")).unwrap();
        let inbox = Inbox::default();
        let _w = start_policy(&etc.join("config.yaml"), None, &inbox).unwrap();
        // An unrelated file next to the target does not count; the target itself does.
        std::fs::write(elsewhere.join("other.txt"), "x").unwrap();
        std::fs::write(elsewhere.join("real.yaml"), "version: v1\nflags: {}\n").unwrap();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                inbox.changed().await;
                if inbox.take().policy {
                    return;
                }
            }
        })
        .await;
        assert!(
            seen.is_ok(),
            "an edit of the symlink's target raised no policy change"
        );
    }

    #[test]
    fn the_data_swap_is_a_commit_and_nothing_else_is() {
        let to = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        assert!(commits(&ev(to, &["/etc/slicelet/..data"])));
        assert!(commits(&ev(
            EventKind::Create(CreateKind::Any),
            &["/etc/slicelet/..data"]
        )));
        assert!(!commits(&ev(
            EventKind::Remove(notify::event::RemoveKind::Any),
            &["/etc/slicelet/..data"]
        )));
        assert!(!commits(&ev(to, &["/etc/slicelet/..data_tmp"])));
        assert!(!commits(&ev(to, &["/etc/slicelet/config.yaml"])));
    }

    #[tokio::test]
    async fn inbox_coalesces_and_keeps_a_wake_up_for_a_late_waiter() {
        let inbox = Inbox::default();
        inbox.mark(|p| p.policy = true);
        inbox.mark(|p| p.kubelet = true);
        inbox.mark(|p| p.policy = true);
        // Nobody waited while marking: the wake-up is kept.
        tokio::time::timeout(std::time::Duration::from_secs(5), inbox.changed())
            .await
            .expect("a stored wake-up");
        let p = inbox.take();
        assert!(p.policy && p.kubelet && !p.node);
        assert!(inbox.take().is_empty());
    }

    #[test]
    fn only_the_file_and_configmap_entries_concern_it() {
        let file = Some(std::ffi::OsStr::new("config.yaml"));
        let modify = EventKind::Modify(ModifyKind::Any);
        // Regression: a log file written next to a simulated node made slicelet re-read the
        // node ten times a second (and log each failure).
        assert!(!concerns(&ev(modify, &["/etc/slicelet/run.log"]), file));
        assert!(!concerns(
            &ev(
                EventKind::Access(AccessKind::Any),
                &["/etc/slicelet/config.yaml"]
            ),
            file
        ));
        assert!(concerns(&ev(modify, &["/etc/slicelet/config.yaml"]), file));
        assert!(concerns(
            &ev(
                EventKind::Modify(ModifyKind::Name(RenameMode::To)),
                &["/etc/slicelet/..data"]
            ),
            file
        ));
        assert!(concerns(
            &ev(
                EventKind::Create(CreateKind::Any),
                &["/etc/slicelet/..2026_11_30_1"]
            ),
            file
        ));
        assert!(concerns(
            &ev(
                EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
                &[
                    "/etc/slicelet/.config.yaml.swp",
                    "/etc/slicelet/config.yaml"
                ]
            ),
            file
        ));
    }
}
