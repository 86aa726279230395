//! MPS control daemons: one `nvidia-cuda-mps-control -f` per GPU (or MIG device) under MPS,
//! supervised, configured with each client's limits, and reported as health events.
//!
//! - **Start.** For each daemon the plan wants ([`crate::plan::MpsWanted`]): create
//!   `<mpsRoot>/<uuid>/{pipe,log}` and the shared `<mpsRoot>/shm` (pipe 0755, shm 1777 like `/dev/shm`), send `quit` to any
//!   daemon already answering there (left by an earlier run), start `<binary> -f` with
//!   `CUDA_VISIBLE_DEVICES=<uuid>`, `CUDA_MPS_PIPE_DIRECTORY` and `CUDA_MPS_LOG_DIRECTORY`, wait
//!   until it answers `get_server_list`, then set one replica's share as its defaults:
//!   `set_default_active_thread_percentage <pct>` and
//!   `set_default_device_pinned_mem_limit 0 <MiB>M` (the daemon sees its one GPU as device 0).
//!   Only then is it reported ready, so its devices are never Healthy without enforced limits.
//! - **Health.** Ready only while the child runs and answers `get_server_list`, checked every
//!   [`Config::check_interval`] (default 5 s) and at once when the child exits. A daemon that
//!   dies or stops answering is reported not ready, killed if needed, and restarted after a
//!   capped exponential backoff ([`Config::restart_min`] doubling to [`Config::restart_max`],
//!   reset once a restarted daemon passes a check). Every transition is logged with the UUID.
//! - **Limit changes.** New limits for a running daemon restart it only when no client is
//!   connected (`get_server_list` empty). Otherwise the change is kept *pending* (logged,
//!   reported) and applied at the first check that finds the GPU drained; until then the event
//!   carries the limits the daemon still enforces, and those are what Allocate advertises.
//! - **Stop.** A daemon no longer wanted, or all of them on shutdown: `quit`, wait for the child
//!   (killed after [`Config::quit_timeout`]), remove `<mpsRoot>/<uuid>`.
//! - **External** ([`Config::external`], `slicelet run --mps-external`): the daemons belong to
//!   `slicelet mps` (its own DaemonSet, whose rollouts do not restart running MPS servers);
//!   this side only checks each pipe directory's daemon with `get_server_list`.
//!
//! One owner: the [`Supervisor`] task owns one task per daemon; the desired set comes in
//! through a `watch` channel, health goes out as [`Event`]s on an `mpsc` channel, which the
//! supervisor folds into device health ([`crate::health_tracker::Tracker`]).

pub mod control;
mod dirs;
mod gpu;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::plan::{MpsLimits, MpsWanted};

/// The control binary found on `PATH` by default.
pub const DEFAULT_CONTROL_BINARY: &str = "nvidia-cuda-mps-control";

/// How daemons are run and checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// `nvidia-cuda-mps-control` (`--mps-control-binary`; tests use a fake).
    pub control_binary: PathBuf,
    /// Only check daemons run by someone else (`slicelet run --mps-external`).
    pub external: bool,
    /// How often a daemon is asked `get_server_list` (default 5 s).
    pub check_interval: Duration,
    /// Deadline for one command (default 5 s).
    pub command_timeout: Duration,
    /// How long a started daemon may take to answer (default 10 s).
    pub start_timeout: Duration,
    /// First restart delay after a failure (default 1 s).
    pub restart_min: Duration,
    /// Longest restart delay (default 60 s).
    pub restart_max: Duration,
    /// How long a daemon may take to exit after `quit` before it is killed (default 2 s).
    pub quit_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            control_binary: PathBuf::from(DEFAULT_CONTROL_BINARY),
            external: false,
            check_interval: Duration::from_secs(5),
            command_timeout: Duration::from_secs(5),
            start_timeout: Duration::from_secs(10),
            restart_min: Duration::from_secs(1),
            restart_max: Duration::from_secs(60),
            quit_timeout: Duration::from_secs(2),
        }
    }
}

/// What one daemon's state became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The GPU or MIG UUID.
    pub uuid: String,
    /// Running, answering, defaults set.
    pub ready: bool,
    /// The limits the daemon enforces (None when unknown: an external daemon, or none running).
    pub applied: Option<MpsLimits>,
    /// A limit change waiting for the GPU to drain.
    pub pending: Option<MpsLimits>,
    /// The daemon is no longer wanted and has stopped.
    pub removed: bool,
}

/// The running supervisor: owns one task per daemon.
pub struct Supervisor {
    wanted: watch::Sender<MpsWanted>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("mps::Supervisor").finish_non_exhaustive()
    }
}

impl Supervisor {
    /// Starts the supervisor with nothing wanted; events go to `events`.
    pub fn spawn(config: Config, events: mpsc::Sender<Event>) -> Self {
        let (wanted, rx) = watch::channel(MpsWanted::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(manage(Arc::new(config), rx, events, stop.clone()));
        Supervisor { wanted, stop, task }
    }

    /// The daemons to run now (starts, reconfigures and stops daemons to match).
    pub fn want(&self, wanted: MpsWanted) {
        self.wanted.send_if_modified(|w| {
            if *w == wanted {
                false
            } else {
                *w = wanted;
                true
            }
        });
    }

    /// Stops every daemon (`quit`, wait, remove its directory) within `deadline`; daemons
    /// still running then are killed.
    pub async fn shutdown(self, deadline: Duration) {
        self.stop.cancel();
        let mut task = self.task;
        if tokio::time::timeout(deadline, &mut task).await.is_err() {
            tracing::warn!("MPS daemons did not stop in time; killing them");
            task.abort();
            let _ = task.await;
        }
    }
}

struct Running {
    root: PathBuf,
    limits: watch::Sender<MpsLimits>,
    stop: CancellationToken,
}

async fn manage(
    config: Arc<Config>,
    mut wanted: watch::Receiver<MpsWanted>,
    events: mpsc::Sender<Event>,
    stop: CancellationToken,
) {
    let mut daemons = Daemons::default();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            Some(_) = daemons.tasks.join_next(), if !daemons.tasks.is_empty() => continue,
            changed = wanted.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
        let want = wanted.borrow_and_update().clone();
        daemons.stop_unwanted(&want).await;
        daemons.start_or_update(&want, &config, &events, &stop);
    }
    // Shutdown: every task quits its daemon and removes its directory.
    for r in daemons.running.values() {
        r.stop.cancel();
    }
    while daemons.tasks.join_next().await.is_some() {}
}

/// The daemon tasks [`manage`] runs.
#[derive(Default)]
struct Daemons {
    /// Each daemon's task, ending with its UUID. Dropping the set (an aborted shutdown) aborts
    /// every daemon task, which kills its child.
    tasks: JoinSet<String>,
    /// The daemons running, by GPU/MIG UUID.
    running: BTreeMap<String, Running>,
}

impl Daemons {
    /// Stops the daemons no longer wanted (or whose root moved), all at once, and waits for
    /// them (each quits its daemon and removes its directory) before a new one may start in
    /// the same place.
    async fn stop_unwanted(&mut self, want: &MpsWanted) {
        let gone: Vec<String> = self
            .running
            .iter()
            .filter(|(u, r)| !want.daemons.contains_key(*u) || r.root != want.root)
            .map(|(u, _)| u.clone())
            .collect();
        for uuid in &gone {
            if let Some(r) = self.running.remove(uuid) {
                r.stop.cancel();
            }
        }
        if !gone.is_empty() {
            while self.running.len() < self.tasks.len() {
                if self.tasks.join_next().await.is_none() {
                    break;
                }
            }
        }
    }

    /// Starts each wanted daemon not running yet; sends the running ones their limits where
    /// they changed.
    fn start_or_update(
        &mut self,
        want: &MpsWanted,
        config: &Arc<Config>,
        events: &mpsc::Sender<Event>,
        stop: &CancellationToken,
    ) {
        for (uuid, d) in &want.daemons {
            if let Some(r) = self.running.get(uuid) {
                r.limits.send_if_modified(|l| {
                    let changed = *l != d.limits;
                    *l = d.limits;
                    changed
                });
                continue;
            }
            let (limits, limits_rx) = watch::channel(d.limits);
            let token = stop.child_token();
            let task = gpu::Task {
                config: Arc::clone(config),
                uuid: uuid.clone(),
                dirs: crate::plan::mps_dirs(&want.root, uuid),
                events: events.clone(),
            };
            let t = token.clone();
            self.tasks.spawn(async move {
                let uuid = task.uuid.clone();
                task.run(limits_rx, t).await;
                uuid
            });
            self.running.insert(
                uuid.clone(),
                Running {
                    root: want.root.clone(),
                    limits,
                    stop: token,
                },
            );
        }
    }
}
