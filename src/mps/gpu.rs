//! One daemon's task: start, configure, check, restart, reconfigure, stop, its directories
//! made and removed through [`super::dirs`]; with `--mps-external`, only check the daemon that
//! `slicelet mps` runs (see the module documentation of [`crate::mps`]).

use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use tokio::process::Child;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::control::{Control, ControlError};
use super::dirs;
use super::{Config, Event};
use crate::plan::{MpsDirs, MpsLimits};

pub(super) struct Task {
    pub(super) config: Arc<Config>,
    pub(super) uuid: String,
    pub(super) dirs: MpsDirs,
    pub(super) events: mpsc::Sender<Event>,
}

/// Why a running daemon's supervision ended.
enum Outcome {
    /// Stop was asked for.
    Stop,
    /// New limits to apply by restarting it (no client connected).
    Reapply,
    /// It died or stopped answering.
    Failed(String),
}

/// The last state reported, so only changes are sent and logged.
struct Reporter {
    uuid: String,
    events: mpsc::Sender<Event>,
    last: Option<Event>,
}

impl Reporter {
    fn report(
        &mut self,
        ready: bool,
        applied: Option<MpsLimits>,
        pending: Option<MpsLimits>,
        why: &str,
    ) {
        let ev = Event {
            uuid: self.uuid.clone(),
            ready,
            applied,
            pending,
            removed: false,
        };
        if self.last.as_ref() == Some(&ev) {
            return;
        }
        let was_ready = self.last.as_ref().is_some_and(|e| e.ready);
        if ready && !was_ready {
            match applied {
                Some(l) => {
                    tracing::info!(gpu = %self.uuid, active_thread_percentage = l.active_thread_percentage,
                    pinned_memory_mib = l.pinned_memory_mib, "MPS control daemon ready: {why}")
                }
                None => tracing::info!(gpu = %self.uuid, "MPS control daemon ready: {why}"),
            }
        } else if !ready && (was_ready || self.last.is_none()) {
            tracing::warn!(gpu = %self.uuid, reason = %why, "MPS control daemon not ready; its devices are Unhealthy");
        }
        self.last = Some(ev.clone());
        self.send(ev);
    }

    /// Reports to the supervisor's bounded channel; a full channel (the supervisor stalled
    /// with hundreds of reports queued) drops the report with an error line. A closed one is
    /// the supervisor shutting down: nobody reads reports any more, and that is no error.
    fn send(&self, ev: Event) {
        match self.events.try_send(ev) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::error!(gpu = %self.uuid, "MPS event not delivered to the supervisor: its channel is full");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::debug!(gpu = %self.uuid, "MPS event after the supervisor stopped reading");
            }
        }
    }

    fn removed(&mut self) {
        self.send(Event {
            uuid: self.uuid.clone(),
            ready: false,
            applied: None,
            pending: None,
            removed: true,
        });
    }
}

fn restart_backoff(config: &Config) -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(config.restart_min)
        .with_max_delay(config.restart_max)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Delays between `get_server_list` attempts while a new daemon comes up.
fn startup_backoff() -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(5))
        .with_max_delay(Duration::from_millis(250))
        .without_max_times()
        .build()
}

impl Task {
    fn control(&self) -> Control {
        Control {
            binary: self.config.control_binary.clone(),
            dirs: self.dirs.clone(),
            timeout: self.config.command_timeout,
        }
    }

    pub(super) async fn run(self, limits: watch::Receiver<MpsLimits>, stop: CancellationToken) {
        let mut reporter = Reporter {
            uuid: self.uuid.clone(),
            events: self.events.clone(),
            last: None,
        };
        if self.config.external {
            self.check_external(&mut reporter, &stop).await;
        } else {
            self.supervise(limits, &mut reporter, &stop).await;
        }
        reporter.removed();
    }

    /// `--mps-external`: only ask the daemon someone else runs whether it answers.
    async fn check_external(&self, reporter: &mut Reporter, stop: &CancellationToken) {
        let control = self.control();
        let mut tick = tokio::time::interval(self.config.check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let result = tokio::select! {
                _ = stop.cancelled() => return,
                r = control.server_list() => r,
            };
            match result {
                Ok(_) => reporter.report(
                    true,
                    None,
                    None,
                    "the external daemon answers get_server_list",
                ),
                Err(e) => reporter.report(false, None, None, &format!("external daemon: {e}")),
            }
        }
    }

    async fn supervise(
        &self,
        mut limits: watch::Receiver<MpsLimits>,
        reporter: &mut Reporter,
        stop: &CancellationToken,
    ) {
        let mut delays = restart_backoff(&self.config);
        loop {
            let want = *limits.borrow_and_update();
            let started = tokio::select! {
                _ = stop.cancelled() => break,
                r = self.start(want) => r,
            };
            let failure = match started {
                Ok(mut child) => {
                    reporter.report(true, Some(want), None, "started, answering, defaults set");
                    match self
                        .watch_running(&mut child, want, &mut limits, reporter, &mut delays, stop)
                        .await
                    {
                        Outcome::Stop => {
                            self.quit(&mut child).await;
                            break;
                        }
                        Outcome::Reapply => {
                            reporter.report(false, None, None, "restarting to apply new limits");
                            self.quit(&mut child).await;
                            continue;
                        }
                        Outcome::Failed(reason) => {
                            let _ = child.kill().await;
                            reason
                        }
                    }
                }
                Err(reason) => reason,
            };
            reporter.report(false, None, None, &failure);
            let delay = delays.next().unwrap_or(self.config.restart_max);
            tracing::warn!(gpu = %self.uuid, reason = %failure, retry_in = ?delay, "restarting the MPS control daemon after a backoff");
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        reporter.report(false, None, None, "stopped");
        self.remove_dirs();
    }

    /// Creates the directories, replaces a daemon left answering there, starts ours, waits
    /// until it answers and sets its defaults.
    async fn start(&self, limits: MpsLimits) -> Result<Child, String> {
        self.create_dirs()
            .map_err(|e| match std::error::Error::source(&e) {
                Some(cause) => format!("MPS directories: {e}: {cause}"),
                None => format!("MPS directories: {e}"),
            })?;
        let control = self.control();
        if control.server_list().await.is_ok() {
            tracing::warn!(gpu = %self.uuid, pipe = %self.dirs.pipe.display(),
                "a control daemon not started by this process answers here; sending it quit");
            let _ = control.send("quit").await;
        }
        let mut child = control
            .spawn_daemon(&self.uuid)
            .map_err(|e| crate::errors::chain(&e))?;
        let answered = tokio::time::timeout(self.config.start_timeout, async {
            let mut delays = startup_backoff();
            loop {
                tokio::select! {
                    status = child.wait() => {
                        return Err(match status {
                            Ok(s) => format!("exited while starting ({s})"),
                            Err(e) => format!("waiting for it: {e}"),
                        });
                    }
                    r = control.server_list() => {
                        if r.is_ok() {
                            return Ok(());
                        }
                    }
                }
                let delay = delays.next().unwrap_or(Duration::from_millis(250));
                tokio::time::sleep(delay).await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "did not answer get_server_list within {:?}",
                self.config.start_timeout
            ))
        });
        if let Err(e) = answered {
            let _ = child.kill().await;
            return Err(e);
        }
        let defaults = [
            format!(
                "set_default_active_thread_percentage {}",
                limits.active_thread_percentage
            ),
            format!(
                "set_default_device_pinned_mem_limit 0 {}M",
                limits.pinned_memory_mib
            ),
        ];
        for command in defaults {
            if let Err(e) = control.send(&command).await {
                let _ = child.kill().await;
                return Err(format!("setting defaults: {e}"));
            }
        }
        Ok(child)
    }

    /// Watches a ready daemon until it must stop, restart with new limits, or has failed.
    async fn watch_running(
        &self,
        child: &mut Child,
        applied: MpsLimits,
        limits: &mut watch::Receiver<MpsLimits>,
        reporter: &mut Reporter,
        delays: &mut backon::ExponentialBackoff,
        stop: &CancellationToken,
    ) -> Outcome {
        let control = self.control();
        let mut tick = tokio::time::interval(self.config.check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut pending: Option<MpsLimits> = None;
        let mut passed_check = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return Outcome::Stop,
                status = child.wait() => {
                    return Outcome::Failed(match status {
                        Ok(s) => format!("the daemon exited ({s})"),
                        Err(e) => format!("waiting for the daemon: {e}"),
                    });
                }
                changed = limits.changed() => {
                    if changed.is_err() {
                        return Outcome::Stop;
                    }
                    let new = *limits.borrow_and_update();
                    if new == applied {
                        if pending.take().is_some() {
                            tracing::info!(gpu = %self.uuid, "pending MPS limit change withdrawn; the daemon's limits are wanted again");
                            reporter.report(true, Some(applied), None, "pending change withdrawn");
                        }
                        continue;
                    }
                    match control.server_list().await {
                        Ok(servers) if servers.is_empty() => {
                            tracing::info!(gpu = %self.uuid, active_thread_percentage = new.active_thread_percentage,
                                pinned_memory_mib = new.pinned_memory_mib, "MPS limits changed and no client is connected; restarting the daemon");
                            return Outcome::Reapply;
                        }
                        Ok(servers) => {
                            tracing::warn!(gpu = %self.uuid, servers = servers.len(), active_thread_percentage = new.active_thread_percentage,
                                pinned_memory_mib = new.pinned_memory_mib,
                                "MPS limits changed while clients are connected: pending until the GPU drains; the current limits stay advertised");
                            pending = Some(new);
                            reporter.report(true, Some(applied), pending, "limit change pending");
                        }
                        Err(e) => return Outcome::Failed(failed_check(&e)),
                    }
                }
                _ = tick.tick() => {
                    match control.server_list().await {
                        Ok(servers) => {
                            if !passed_check {
                                passed_check = true;
                                *delays = restart_backoff(&self.config);
                            }
                            if pending.is_some() && servers.is_empty() {
                                tracing::info!(gpu = %self.uuid, "GPU drained; applying the pending MPS limits");
                                return Outcome::Reapply;
                            }
                        }
                        Err(e) => return Outcome::Failed(failed_check(&e)),
                    }
                }
            }
        }
    }

    /// `quit`, then wait for the child; kill it if it does not exit in time.
    async fn quit(&self, child: &mut Child) {
        if let Err(e) = self.control().send("quit").await {
            tracing::warn!(gpu = %self.uuid, error = %crate::errors::chain(&e), "quit failed; killing the MPS control daemon");
        }
        if tokio::time::timeout(self.config.quit_timeout, child.wait())
            .await
            .is_err()
        {
            tracing::warn!(gpu = %self.uuid, "MPS control daemon did not exit after quit; killing it");
            let _ = child.kill().await;
        }
    }

    fn create_dirs(&self) -> Result<(), dirs::DirError> {
        dirs::create(&self.dirs)
    }

    fn remove_dirs(&self) {
        match dirs::remove(&self.dirs) {
            Ok(true) => {
                tracing::info!(gpu = %self.uuid, dir = %self.dirs.base.display(), "MPS control daemon stopped; directory removed")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(gpu = %self.uuid, error = %crate::errors::chain(&e), "not removing the MPS directory")
            }
        }
    }
}

fn failed_check(e: &ControlError) -> String {
    format!("get_server_list failed: {}", crate::errors::chain(e))
}
