//! File-system events → typed events on a tokio channel (the only user of notify).
//!
//! Directories are watched, not files: a mounted ConfigMap updates by swapping its `..data`
//! symlink (no event names the policy file), and the kubelet wipes the device-plugin directory
//! and creates a new `kubelet.sock` when it restarts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use notify::event::EventKind;
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc::UnboundedSender;

use crate::api::KUBELET_SOCKET;

/// What changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Something in the policy file's directory changed (debounce and re-read).
    PolicyDirChanged,
    /// `kubelet.sock` was created: a kubelet (re)started.
    KubeletSocketCreated,
    /// A `slicelet-*.sock` file was removed (by the kubelet wiping the directory, or by hand).
    PluginSocketRemoved(OsString),
    /// Something in the simulated node file's directory changed (debounce and re-read).
    NodeDirChanged,
    /// The policy file's directory itself was replaced (renamed away and created anew): the
    /// watches must be re-attached to the new directory.
    PolicyDirReplaced,
}

/// Watching a directory failed.
#[derive(Debug, thiserror::Error)]
#[error("watching {path}: {source}")]
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
/// simulated node, the node file's directory, sending [`Event`]s to `tx`. Access events are
/// ignored.
///
/// # Errors
/// [`WatchError`] when a directory cannot be watched (e.g. it does not exist).
pub fn start(
    policy_file: &Path,
    device_plugin_dir: &Path,
    node_file: Option<&Path>,
    tx: UnboundedSender<Event>,
) -> Result<Watches, WatchError> {
    let mut watches = start_policy(policy_file, node_file, tx.clone())?;
    watches
        ._watchers
        .push(watch_dir(device_plugin_dir, move |ev| {
            for path in &ev.paths {
                let Some(name) = path.file_name() else {
                    continue;
                };
                match ev.kind {
                    EventKind::Create(_) if name == KUBELET_SOCKET => {
                        let _ = tx.send(Event::KubeletSocketCreated);
                    }
                    EventKind::Remove(_) if name.to_string_lossy().starts_with("slicelet-") => {
                        let _ = tx.send(Event::PluginSocketRemoved(name.to_os_string()));
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

/// Watches the policy file's parent directory and, for a simulated node, the node file's
/// directory (`slicelet mps`, which has no kubelet).
///
/// # Errors
/// [`WatchError`] when a directory cannot be watched.
pub fn start_policy(
    policy_file: &Path,
    node_file: Option<&Path>,
    tx: UnboundedSender<Event>,
) -> Result<Watches, WatchError> {
    let mut watchers = Vec::new();
    // The directory's parent, for the directory itself being replaced (an inotify watch
    // follows the old directory, not the path). Best effort: `/` has no parent to watch.
    let dir = parent(policy_file);
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
                let _ = gtx.send(Event::PolicyDirReplaced);
            }
        }) {
            watchers.push(w);
        }
    }
    let ptx = tx.clone();
    let policy_name = policy_file.file_name().map(OsString::from);
    watchers.push(watch_dir(&parent(policy_file), move |ev| {
        if concerns(&ev, policy_name.as_deref()) {
            let _ = ptx.send(Event::PolicyDirChanged);
        }
    })?);
    if let Some(node) = node_file {
        let ntx = tx.clone();
        let node_name = node.file_name().map(OsString::from);
        watchers.push(watch_dir(&parent(node), move |ev| {
            if concerns(&ev, node_name.as_deref()) {
                let _ = ntx.send(Event::NodeDirChanged);
            }
        })?);
    }
    Ok(Watches {
        _watchers: watchers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, ModifyKind, RenameMode};

    fn ev(kind: EventKind, paths: &[&str]) -> notify::Event {
        let mut e = notify::Event::new(kind);
        for p in paths {
            e = e.add_path(PathBuf::from(p));
        }
        e
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
