//! `slicelet mps --config FILE [--simulate NODE]`: the MPS supervisor alone, for a DaemonSet of
//! its own (with `slicelet run --mps-external` on the same node), so that rolling out the
//! device plugin never restarts running MPS servers.
//!
//! It reads the same policy and GPUs as `slicelet run`, builds the same plan, and runs the
//! control daemons that plan wants ([`crate::mps::Supervisor`]); the policy's directory (and a
//! simulated node's) is watched, re-read every `--policy-resync-seconds` and on SIGHUP. An
//! invalid policy keeps the daemons of the last good one. On SIGTERM/SIGINT it sends `quit` to
//! its daemons, removes their directories and restores compute modes.

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{ComputeModes, Supervisor};
use crate::daemon::{open_source, DaemonError, Settings, MPS_SHUTDOWN_DEADLINE, POLICY_DEBOUNCE};
use crate::inventory::{GpuSource, Inventory};
use crate::plan;
use crate::policy;
use crate::watch as fswatch;

struct Standalone {
    settings: Settings,
    source: Box<dyn GpuSource>,
    inventory: Inventory,
    policy: Option<policy::Policy>,
    hash: Option<[u8; 32]>,
    supervisor: Supervisor,
    compute: ComputeModes,
}

/// Runs the MPS supervisor until `shutdown` is cancelled.
///
/// # Errors
/// [`DaemonError`] when the GPUs cannot be discovered or a directory cannot be watched. An
/// invalid policy is not an error (it is logged and the last good one kept).
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<(), DaemonError> {
    let mut source = open_source(&settings).map_err(|e| match settings.simulate {
        Some(_) => DaemonError::Simulated(e),
        None => DaemonError::Inventory(e),
    })?;
    let inventory = source.discover().map_err(|e| match settings.simulate {
        Some(_) => DaemonError::Simulated(e),
        None => DaemonError::Inventory(e),
    })?;
    tracing::info!(source = %source.describe(), gpus = inventory.gpus.len(), "GPUs discovered; supervising MPS control daemons");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _watches = fswatch::start_policy(&settings.config, settings.simulate.as_deref(), tx)?;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut config = settings.mps.clone();
    config.external = false;
    let mut s = Standalone {
        supervisor: Supervisor::spawn(config, events_tx),
        settings,
        source,
        inventory,
        policy: None,
        hash: None,
        compute: ComputeModes::default(),
    };
    s.reload(true);
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut debounce: Option<Instant> = None;
    let mut resync = tokio::time::interval(s.settings.policy_resync_interval);
    resync.tick().await;
    // MIG layout changes (mig-parted) on a real node raise no file event: re-discover
    // periodically, as `slicelet run` does.
    let mut inventory_resync = tokio::time::interval(s.settings.inventory_resync_interval);
    inventory_resync.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = rx.recv() => {
                debounce.get_or_insert_with(|| Instant::now() + POLICY_DEBOUNCE);
            }
            _ = async { tokio::time::sleep_until(debounce.expect("guarded")).await }, if debounce.is_some() => {
                debounce = None;
                s.rediscover();
                s.reload(false);
            }
            // Health is logged by the supervisor; nothing here serves devices.
            Some(_) = events.recv() => {}
            Some(_) = async { hangup.as_mut()?.recv().await }, if hangup.is_some() => {
                tracing::info!("SIGHUP: re-reading the policy and re-discovering GPUs");
                s.rediscover();
                s.reload(true);
            }
            _ = resync.tick() => s.reload(false),
            _ = inventory_resync.tick() => {
                // A changed inventory clears the applied hash, so this re-plans only then.
                s.rediscover();
                s.reload(false);
            }
        }
    }
    let Standalone {
        supervisor,
        mut source,
        mut compute,
        ..
    } = s;
    supervisor.shutdown(MPS_SHUTDOWN_DEADLINE).await;
    compute.restore_all(source.as_mut());
    tracing::info!("stopped: every MPS control daemon quit and its directory removed");
    Ok(())
}

impl Standalone {
    fn rediscover(&mut self) {
        match self.source.discover() {
            Ok(inv) if inv != self.inventory => {
                tracing::info!(gpus = inv.gpus.len(), "GPU inventory changed");
                self.inventory = inv;
                self.hash = None;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "GPU re-discovery failed; keeping the last inventory")
            }
        }
    }

    fn reload(&mut self, force: bool) {
        let path = &self.settings.config;
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(policy = %path.display(), error = %e, "cannot read the policy");
                return;
            }
        };
        let hash: [u8; 32] = Sha256::digest(&text).into();
        if !force && self.hash == Some(hash) {
            return;
        }
        self.hash = Some(hash);
        let built = policy::parse(&String::from_utf8_lossy(&text))
            .map_err(|e| e.to_string())
            .and_then(|p| {
                let built = plan::build(&p, &self.inventory).map_err(|e| e.to_string())?;
                Ok((p, built))
            });
        match built {
            Ok((p, built)) => {
                let wanted = built.plan.mps_wanted();
                tracing::info!(policy = %path.display(), daemons = wanted.daemons.len(), "policy applied");
                self.compute
                    .sync(self.source.as_mut(), &wanted.exclusive_gpus());
                self.supervisor.want(wanted);
                self.policy = Some(p);
            }
            Err(e) => {
                let keeping = if self.policy.is_some() {
                    "keeping the daemons of the last good policy"
                } else {
                    "no daemon runs until it is fixed"
                };
                tracing::error!(policy = %path.display(), error = %e, "policy rejected; {keeping}");
            }
        }
    }
}
