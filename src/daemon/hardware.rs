//! The hardware actor: the one thread that touches NVML (or the simulated node file).
//!
//! NVML calls block, some for hundreds of milliseconds (a GPU falling off the bus, a driver
//! busy with a reset); on the async runtime they would stall Allocate and ListAndWatch. So every
//! call — opening the library, discovery, probes, compute-mode changes, use samples (with the
//! `/proc` and checkpoint reads that attribute them, [`crate::usage::sampler`]), re-arming the
//! Xid event thread — runs here, on a dedicated OS thread that receives [`Command`]s over a channel and
//! answers with [`Report`]s on the supervisor's **bounded** channel. The Xid event thread the
//! source starts reports through the same channel.
//!
//! A full channel never blocks a hardware thread forever: a report waits at most
//! [`REPORT_SEND_TIMEOUT`] for room (logged), and is then dropped with an error line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::device_health::HealthEvent;
use crate::inventory::compute::ComputeModes;
use crate::inventory::{EventSink, GpuSource, Inventory, InventoryError};

/// How long a hardware thread waits for room in the supervisor's channel before it drops a
/// report (and logs it).
pub const REPORT_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens the GPU source (NVML initialisation or the simulated node file); called on the actor
/// thread, again after each failure when asked to discover.
pub type Opener = Box<dyn FnMut() -> Result<Box<dyn GpuSource>, InventoryError> + Send>;

/// What the supervisor asks of the hardware.
#[derive(Debug, PartialEq)]
pub enum Command {
    /// Discover every GPU now (opening the source first if it is not open): answered by
    /// [`Report::Discovered`], followed by any Xids the discovery found (simulated `xid:`).
    /// After a successful discovery that changed the GPUs the Xid watch is re-armed.
    Discover,
    /// Ask whether each device still answers: answered by [`Report::Probed`].
    Probe(Vec<String>),
    /// Compute mode EXCLUSIVE_PROCESS on exactly these GPUs (MPS with `exclusiveProcess`);
    /// GPUs that leave the set get their previous mode back.
    ComputeModes(BTreeSet<String>),
    /// Sample every GPU now and attribute its processes to pods: answered by
    /// [`Report::Sampled`] (see [`crate::usage::sampler`]). Identical requests still queued are
    /// answered by one sample.
    Sample(SampleRequest),
    /// DRA's MIG request (dynamic MIG), answered on its own channel: a create or destroy is
    /// followed by a discovery (reported as for [`Command::Discover`]), so the plan sees the
    /// new inventory; an inventory request is answered by a discovery made now. Served in
    /// order with every other command, so no two MIG calls ever run at once.
    Mig(MigCall),
    /// A MIG layout's change of one GPU (docs/mig.md, "MIG layouts"): destroy its instances,
    /// then create the wanted ones, stopping at the first failure; then a discovery (reported
    /// as for [`Command::Discover`]), then [`Report::MigApplied`]. MIG mode is never touched.
    MigLayout(crate::plan::mig_layout::GpuChange),
}

/// A MIG request of DRA's ([`crate::dra::mig::MigRequest`]).
#[derive(Debug)]
pub struct MigCall(pub crate::dra::mig::MigRequest);

impl PartialEq for MigCall {
    /// Never: each request has its own answer, so two are never merged.
    fn eq(&self, _: &Self) -> bool {
        false
    }
}

/// Where a [`Command::Sample`] looks for what attributes processes to pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleRequest {
    /// Where the host's `/proc` is mounted, as its parent: `<proc_root>/proc/<pid>/cgroup`
    /// (`--proc-root`, [`crate::settings::Settings::proc_root`]).
    pub proc_root: PathBuf,
    /// The kubelet's device checkpoint ([`crate::settings::Settings::checkpoint_path`]).
    pub checkpoint: PathBuf,
    /// slicelet's DRA checkpoint (`<--dra-plugins-dir>/<driver>/checkpoint.json`) with
    /// `--dra`: the prepared claims and the pods each is reserved for
    /// ([`crate::usage::Samples::claims`]); `None` without `--dra`.
    pub dra_checkpoint: Option<PathBuf>,
}

/// What the hardware reports.
#[derive(Debug)]
pub enum Report {
    /// The result of a [`Command::Discover`], with the source's description for logs.
    Discovered(Result<(Inventory, String), InventoryError>),
    /// A health event: an Xid, or whether a GPU is watched for Xids.
    Health(HealthEvent),
    /// Probe answers: (UUID, answers).
    Probed(Vec<(String, bool)>),
    /// The result of a [`Command::Sample`]: the sample, or why there is none. The supervisor
    /// keeps its last figures on an error.
    Sampled(Result<crate::usage::Samples, SampleError>),
    /// The result of a [`Command::MigLayout`], after its discovery: done, or the driver's
    /// reason (the first create or destroy that failed).
    MigApplied(Result<(), String>),
}

/// Why a [`Command::Sample`] has no sample.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// No discovery succeeded yet, so there is no source to sample.
    #[error("the GPU source is not open yet (no discovery succeeded)")]
    NotOpen,
    /// The source could not be sampled (shown as the error and its sources on one line).
    #[error("{}", crate::errors::chain(.0))]
    Source(#[source] InventoryError),
}

/// Sends reports from hardware threads into the supervisor's bounded channel.
#[derive(Clone)]
struct Outbox {
    tx: mpsc::Sender<Report>,
    runtime: tokio::runtime::Handle,
}

impl Outbox {
    fn send(&self, report: Report) {
        match self.tx.try_send(report) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(report)) => {
                tracing::warn!(
                    "the supervisor's channel is full; a hardware report waits for room"
                );
                let sent = self.runtime.block_on(async {
                    tokio::time::timeout(REPORT_SEND_TIMEOUT, self.tx.send(report)).await
                });
                if sent.is_err() {
                    tracing::error!(
                        timeout = ?REPORT_SEND_TIMEOUT,
                        "the supervisor did not take a hardware report in time; dropped"
                    );
                }
            }
        }
    }
}

/// The running actor. Dropping it (or [`Hardware::shutdown`]) restores compute modes, stops
/// the Xid watch and closes the source on the actor thread.
pub struct Hardware {
    commands: Option<std_mpsc::Sender<Command>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Hardware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hardware").finish_non_exhaustive()
    }
}

impl Hardware {
    /// Starts the actor thread. Nothing is opened until the first [`Command::Discover`].
    /// Must be called inside a tokio runtime (reports are sent through it).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(open: Opener, reports: mpsc::Sender<Report>) -> Self {
        let (tx, rx) = std_mpsc::channel();
        let outbox = Outbox {
            tx: reports,
            runtime: tokio::runtime::Handle::current(),
        };
        let thread = std::thread::Builder::new()
            .name("hardware".into())
            .spawn(move || actor(open, &rx, &outbox))
            .expect("spawning the hardware thread");
        Hardware {
            commands: Some(tx),
            thread: Some(thread),
        }
    }

    /// Queues a command (never blocks; the actor runs commands in order).
    pub fn send(&self, command: Command) {
        if let Some(tx) = &self.commands {
            let _ = tx.send(command);
        }
    }

    /// Stops the actor and waits for it (off the runtime's worker threads) up to `deadline`.
    pub async fn shutdown(mut self, deadline: Duration) {
        self.commands = None;
        if let Some(thread) = self.thread.take() {
            let join = tokio::task::spawn_blocking(move || thread.join());
            if tokio::time::timeout(deadline, join).await.is_err() {
                tracing::warn!(
                    "the hardware thread did not stop in time (an NVML call is still blocked)"
                );
            }
        }
    }
}

impl Drop for Hardware {
    fn drop(&mut self) {
        // Closing the channel ends the actor; it is not joined here (drop may run on the
        // runtime, and an NVML call may still be blocked).
        self.commands = None;
    }
}

/// Takes the next command, merging duplicates still queued: every queued `Discover` (and every
/// identical `Sample`) is answered once, and a `ComputeModes` is superseded by a later one.
fn next_command(queue: &mut std::collections::VecDeque<Command>) -> Option<Command> {
    let command = queue.pop_front()?;
    match &command {
        Command::Discover | Command::Sample(_) => queue.retain(|c| *c != command),
        Command::ComputeModes(_) => {
            if queue.iter().any(|c| matches!(c, Command::ComputeModes(_))) {
                return None;
            }
        }
        Command::Probe(_) | Command::Mig(_) | Command::MigLayout(_) => {}
    }
    Some(command)
}

/// The actor's state: the GPU source once opened, the compute modes it set, the last
/// inventory (to re-arm the Xid watch when it changes) and where Xid events go.
struct Actor {
    open: Opener,
    source: Option<Box<dyn GpuSource>>,
    compute: ComputeModes,
    last: Option<Inventory>,
    sink: EventSink,
    /// Cgroups seen with a GPU memory limit, asked again once gone.
    limits: crate::usage::sampler::LimitWatch,
}

impl Actor {
    /// Opens the source when needed, discovers, re-arms the Xid watch for new GPUs and
    /// reports the inventory and the Xids seen meanwhile; the inventory, when discovered.
    fn discover(&mut self, outbox: &Outbox) -> Option<Inventory> {
        if self.source.is_none() {
            match (self.open)() {
                Ok(s) => self.source = Some(s),
                Err(e) => {
                    outbox.send(Report::Discovered(Err(e)));
                    return None;
                }
            }
        }
        let s = self.source.as_mut()?;
        let result = s.discover();
        let events = s.take_events();
        if let Ok(inv) = &result {
            if self.last.as_ref() != Some(inv) {
                // Re-arm the Xid watch for the new GPUs (joins the previous event thread: up
                // to one NVML wait, here and not on the runtime).
                s.watch_events(Arc::clone(&self.sink));
                self.last = Some(inv.clone());
            }
        }
        let describe = s.describe();
        let found = result.as_ref().ok().cloned();
        outbox.send(Report::Discovered(result.map(|inv| (inv, describe))));
        for x in events {
            outbox.send(Report::Health(HealthEvent::Xid {
                uuid: x.uuid,
                xid: x.xid,
            }));
        }
        found
    }

    /// Serves one of DRA's MIG requests ([`Command::Mig`]): the source's create or destroy,
    /// answered, then a discovery; or a discovery, answered.
    fn mig(&mut self, request: crate::dra::mig::MigRequest, outbox: &Outbox) {
        use crate::dra::mig::MigRequest;
        let not_open = || InventoryError::NvmlCount("the GPU source is not open yet".to_string());
        match request {
            MigRequest::Create {
                gpu_uuid,
                profile,
                start,
                reply,
            } => {
                let r = match self.source.as_mut() {
                    Some(s) => s.create_mig(&gpu_uuid, &profile, start),
                    None => Err(not_open()),
                };
                let _ = reply.send(r);
                self.discover(outbox);
            }
            MigRequest::Destroy {
                gpu_uuid,
                gi_id,
                ci_id,
                reply,
            } => {
                let r = match self.source.as_mut() {
                    Some(s) => s.destroy_mig(&gpu_uuid, gi_id, ci_id),
                    None => Err(not_open()),
                };
                let _ = reply.send(r);
                self.discover(outbox);
            }
            MigRequest::Inventory { reply } => {
                let found = self.discover(outbox);
                let _ = reply.send(found);
            }
        }
    }

    /// Changes one GPU's MIG instances for a layout ([`Command::MigLayout`]): destroys, then
    /// creates, stopping at the first failure; then discovers, then reports the result.
    fn mig_layout(&mut self, change: &crate::plan::mig_layout::GpuChange, outbox: &Outbox) {
        let result = match self.source.as_mut() {
            None => Err("the GPU source is not open yet".to_string()),
            Some(s) => apply_layout(s.as_mut(), change),
        };
        self.discover(outbox);
        outbox.send(Report::MigApplied(result));
    }

    /// Whether each GPU answers (recovery probes); `false` while no source is open.
    fn probe(&mut self, uuids: Vec<String>) -> Vec<(String, bool)> {
        uuids
            .into_iter()
            .map(|u| {
                let ok = self.source.as_mut().is_some_and(|s| s.probe(&u));
                (u, ok)
            })
            .collect()
    }

    /// One GPU use sample, or why there is none.
    fn sample(&mut self, request: &SampleRequest) -> Result<crate::usage::Samples, SampleError> {
        match self.source.as_mut() {
            None => Err(SampleError::NotOpen),
            Some(s) => {
                let mut samples = crate::usage::sampler::sample(
                    s.as_mut(),
                    &request.proc_root,
                    &request.checkpoint,
                    &mut self.limits,
                )
                .map_err(SampleError::Source)?;
                samples.claims = request.dra_checkpoint.as_deref().and_then(read_claims);
                Ok(samples)
            }
        }
    }
}

/// The prepared claims of slicelet's DRA checkpoint at `path`, for attribution (a missing
/// file: none prepared); `None` when it cannot be read (the DRA component sets a corrupt one
/// aside and says so; until then the use of DRA holders is unknown).
fn read_claims(path: &Path) -> Option<Vec<crate::usage::ClaimEntry>> {
    match crate::dra::checkpoint::load(path) {
        Ok(c) => Some(crate::dra::checkpoint::claim_entries(&c)),
        Err(e) => {
            tracing::debug!(error = %crate::errors::chain(&e), "the DRA checkpoint cannot be read; the GPU use of DRA holders is unknown");
            None
        }
    }
}

/// Destroys `change`'s instances, then creates the wanted ones, on `source`; the first
/// failure, with the call that failed and the driver's reason.
fn apply_layout(
    source: &mut dyn GpuSource,
    change: &crate::plan::mig_layout::GpuChange,
) -> Result<(), String> {
    let reason = |e: InventoryError| crate::errors::chain(&e);
    for (gi, ci, _) in &change.destroy {
        source.destroy_mig(&change.uuid, *gi, *ci).map_err(reason)?;
    }
    for (profile, at) in &change.create {
        source
            .create_mig(&change.uuid, profile, at.start)
            .map_err(reason)?;
    }
    Ok(())
}

fn actor(open: Opener, commands: &std_mpsc::Receiver<Command>, outbox: &Outbox) {
    let sink: EventSink = {
        let outbox = outbox.clone();
        Arc::new(move |e| outbox.send(Report::Health(e)))
    };
    let mut a = Actor {
        open,
        source: None,
        compute: ComputeModes::default(),
        last: None,
        sink,
        limits: crate::usage::sampler::LimitWatch::default(),
    };
    let mut queue: std::collections::VecDeque<Command> = std::collections::VecDeque::new();
    loop {
        if queue.is_empty() {
            match commands.recv() {
                Ok(c) => queue.push_back(c),
                Err(_) => break,
            }
        }
        // Coalesce what queued up meanwhile (a SIGHUP storm while NVML is slow): one discovery
        // answers every queued request, and only the last compute-mode set matters.
        queue.extend(commands.try_iter());
        let Some(command) = next_command(&mut queue) else {
            continue;
        };
        match command {
            Command::Discover => {
                a.discover(outbox);
            }
            Command::Mig(MigCall(request)) => a.mig(request, outbox),
            Command::MigLayout(change) => a.mig_layout(&change, outbox),
            Command::Probe(uuids) => outbox.send(Report::Probed(a.probe(uuids))),
            Command::ComputeModes(wanted) => {
                if let Some(s) = a.source.as_mut() {
                    a.compute.sync(s.as_mut(), &wanted);
                }
            }
            Command::Sample(request) => outbox.send(Report::Sampled(a.sample(&request))),
        }
    }
    if let Some(s) = a.source.as_mut() {
        a.compute.restore_all(s.as_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{test_node, XidEvent};
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Slow {
        calls: Arc<AtomicU32>,
        events: Vec<XidEvent>,
    }

    impl GpuSource for Slow {
        fn discover(&mut self) -> Result<Inventory, InventoryError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(test_node(2))
        }
        fn take_events(&mut self) -> Vec<XidEvent> {
            std::mem::take(&mut self.events)
        }
        fn probe(&mut self, uuid: &str) -> bool {
            uuid.ends_with('0')
        }
        fn describe(&self) -> String {
            "slow".into()
        }
        fn sample(&mut self) -> Result<Vec<crate::inventory::sample::GpuSample>, InventoryError> {
            self.calls.fetch_add(100, Ordering::SeqCst);
            Ok(vec![crate::inventory::sample::GpuSample {
                uuid: "GPU-x".into(),
                processes: vec![
                    crate::inventory::sample::ProcessSample {
                        pid: 7,
                        sm_util_percent: Some(30),
                        ..Default::default()
                    },
                    crate::inventory::sample::ProcessSample {
                        pid: 8,
                        sm_util_percent: Some(10),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }])
        }
    }

    fn request(dir: &str) -> SampleRequest {
        SampleRequest {
            proc_root: dir.into(),
            checkpoint: format!("{dir}/cp").into(),
            dra_checkpoint: None,
        }
    }

    #[test]
    fn queued_commands_coalesce() {
        let mut q: std::collections::VecDeque<Command> = [
            Command::Sample(request("/a")),
            Command::Sample(request("/b")),
            Command::Sample(request("/a")),
            Command::Discover,
            Command::ComputeModes(["a".to_string()].into()),
            Command::Discover,
            Command::Probe(vec!["x".into()]),
            Command::ComputeModes(BTreeSet::new()),
            Command::Discover,
        ]
        .into();
        let mut out = Vec::new();
        while !q.is_empty() {
            out.extend(next_command(&mut q));
        }
        assert_eq!(
            out,
            [
                Command::Sample(request("/a")),
                Command::Sample(request("/b")),
                Command::Discover,
                Command::Probe(vec!["x".into()]),
                Command::ComputeModes(BTreeSet::new()),
            ]
        );
    }

    #[tokio::test]
    async fn answers_in_order_and_retries_a_failed_open() {
        let (tx, mut rx) = mpsc::channel(4);
        let calls = Arc::new(AtomicU32::new(0));
        let opens = Arc::new(AtomicU32::new(0));
        let (c, o) = (Arc::clone(&calls), Arc::clone(&opens));
        let hw = Hardware::spawn(
            Box::new(move || {
                if o.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(InventoryError::NvmlCount("not yet".into()));
                }
                Ok(Box::new(Slow {
                    calls: Arc::clone(&c),
                    events: vec![XidEvent {
                        uuid: "GPU-x".into(),
                        xid: 79,
                    }],
                }) as Box<dyn GpuSource>)
            }),
            tx,
        );
        hw.send(Command::Discover);
        assert!(matches!(rx.recv().await, Some(Report::Discovered(Err(_)))));
        hw.send(Command::Discover);
        match rx.recv().await {
            Some(Report::Discovered(Ok((inv, d)))) => {
                assert_eq!((inv.gpus.len(), d.as_str()), (2, "slow"))
            }
            other => panic!("{other:?}"),
        }
        match rx.recv().await {
            Some(Report::Health(HealthEvent::Xid { uuid, xid })) => {
                assert_eq!((uuid.as_str(), xid), ("GPU-x", 79))
            }
            other => panic!("{other:?}"),
        }
        hw.send(Command::Probe(vec!["a0".into(), "a1".into()]));
        match rx.recv().await {
            Some(Report::Probed(p)) => {
                assert_eq!(p, vec![("a0".to_string(), true), ("a1".to_string(), false)])
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(opens.load(Ordering::SeqCst), 2);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        hw.shutdown(Duration::from_secs(5)).await;
    }

    #[tokio::test]
    async fn samples_are_attributed_and_need_an_open_source() {
        let dir = tempfile::tempdir().unwrap();
        let uid = "0f5a3b2c-1d4e-4f60-8a7b-9c0d1e2f3a4b";
        let cgroup = crate::usage::cgroup::path(dir.path(), 7);
        std::fs::create_dir_all(cgroup.parent().unwrap()).unwrap();
        std::fs::write(
            &cgroup,
            format!("0::/kubepods/burstable/pod{uid}/{}\n", "a".repeat(64)),
        )
        .unwrap();
        let req = SampleRequest {
            proc_root: dir.path().to_path_buf(),
            checkpoint: dir.path().join("kubelet_internal_checkpoint"),
            dra_checkpoint: Some(dir.path().join("dra-checkpoint.json")),
        };
        let (tx, mut rx) = mpsc::channel(4);
        let calls = Arc::new(AtomicU32::new(0));
        let c = Arc::clone(&calls);
        let hw = Hardware::spawn(
            Box::new(move || {
                Ok(Box::new(Slow {
                    calls: Arc::clone(&c),
                    events: Vec::new(),
                }) as Box<dyn GpuSource>)
            }),
            tx,
        );
        hw.send(Command::Sample(req.clone()));
        match rx.recv().await {
            Some(Report::Sampled(Err(e))) => {
                assert!(e.to_string().contains("not open yet"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        hw.send(Command::Discover);
        assert!(matches!(rx.recv().await, Some(Report::Discovered(Ok(_)))));
        hw.send(Command::Sample(req));
        match rx.recv().await {
            Some(Report::Sampled(Ok(s))) => {
                let p = &s.gpus[0].processes;
                assert_eq!(p[0].pod_uid.as_deref(), Some(uid));
                assert_eq!(p[0].container_id, Some("a".repeat(64)));
                assert_eq!((p[1].pid, p[1].pod_uid.as_deref()), (8, None));
                assert!(s.at_unix_ms > 0);
                assert!(s.checkpoint.is_none() && s.checkpoint_error.is_some());
                // No DRA checkpoint yet: no claim prepared (known, empty).
                assert_eq!(s.claims, Some(Vec::new()));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            101,
            "one discovery, one sample"
        );
        hw.shutdown(Duration::from_secs(5)).await;
    }

    /// A layout's change on a simulated H100: destroys first, then creates, and stops at the
    /// first create the "driver" refuses, with its reason; what was done stays done.
    #[test]
    fn a_layout_change_stops_at_the_first_refusal_with_the_drivers_reason() {
        use crate::inventory::simulated::SimulatedSource;
        use crate::inventory::MigPlacement;
        use crate::plan::mig_layout::GpuChange;
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("node.yaml");
        std::fs::write(
            &node,
            "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig: {}\n",
        )
        .unwrap();
        let mut source = SimulatedSource::new(node);
        let gpu = source.discover().unwrap().gpus[0].uuid.clone();
        let at = |start, size| MigPlacement { start, size };
        let change = GpuChange {
            index: 0,
            uuid: gpu.clone(),
            destroy: vec![],
            create: vec![
                ("3g.40gb".to_string(), at(4, 4)),
                ("3g.40gb".to_string(), at(4, 4)),
                ("3g.40gb".to_string(), at(0, 4)),
            ],
        };
        let why = apply_layout(&mut source, &change).unwrap_err();
        assert!(why.contains("3g.40gb") && why.contains('4'), "{why}");
        let inv = source.discover().unwrap();
        let starts: Vec<Option<u32>> = inv.gpus[0]
            .mig_devices
            .iter()
            .map(|m| m.placement.map(|p| p.start))
            .collect();
        assert_eq!(
            starts,
            [Some(4)],
            "the first create stays, the third never ran"
        );
        // Destroy what exists, then create: both done.
        let m = &inv.gpus[0].mig_devices[0];
        let redo = GpuChange {
            index: 0,
            uuid: gpu,
            destroy: vec![(m.gi_id, m.ci_id, m.uuid.clone())],
            create: vec![("7g.80gb".to_string(), at(0, 8))],
        };
        apply_layout(&mut source, &redo).unwrap();
        let inv = source.discover().unwrap();
        let profiles: Vec<&str> = inv.gpus[0]
            .mig_devices
            .iter()
            .map(|m| m.profile.as_str())
            .collect();
        assert_eq!(profiles, ["7g.80gb"]);
    }
}
