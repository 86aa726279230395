//! The NVML Xid event-watch thread: one thread at a time per NVML source, started for the GPUs
//! of the last discovery (and replaced, the old one stopped and joined, when a discovery finds
//! them changed), waits on an NVML event set for `nvmlEventTypeXidCriticalError` events and
//! reports every Xid, and whether each GPU is watched, as health events. Which Xids are
//! critical is decided where they are folded ([`crate::health_tracker::XidPolicy`]), not here.

use std::os::raw::{c_uint, c_ulonglong};

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlReturn_t};

use crate::device_health::HealthEvent;
use crate::inventory::EventSink;

/// `nvmlEventTypeXidCriticalError`.
const XID_CRITICAL_ERROR: u64 = 8;
/// GPU-/compute-instance id of an event that concerns the whole GPU.
pub(super) const WHOLE_GPU: u32 = 0xFFFF_FFFF;
/// How long one `nvmlEventSetWait_v2` blocks, so the thread notices a stop request, ms.
const EVENT_WAIT_MS: c_uint = 500;

/// A GPU the event thread watches, with its MIG devices as (GI id, CI id, UUID).
pub(super) struct EventTarget {
    pub(super) index: u32,
    pub(super) uuid: String,
    pub(super) migs: Vec<(u32, u32, String)>,
}

impl EventTarget {
    /// The devices an event with these instance ids concerns: the GPU (GI id 0xFFFFFFFF, or
    /// ids that match no MIG device), or every MIG device of that GPU instance (CI id
    /// 0xFFFFFFFF), or the one MIG device.
    pub(super) fn uuids_for(&self, gi: u32, ci: u32) -> Vec<&str> {
        if gi == WHOLE_GPU {
            return vec![&self.uuid];
        }
        let migs: Vec<&str> = self
            .migs
            .iter()
            .filter(|(g, c, _)| *g == gi && (ci == WHOLE_GPU || *c == ci))
            .map(|(_, _, u)| u.as_str())
            .collect();
        if migs.is_empty() {
            vec![&self.uuid]
        } else {
            migs
        }
    }
}

/// The thread that reads NVML Xid events (blocking waits with a timeout, so it can stop; it
/// stops and is joined when this is dropped). nvml-wrapper's safe event API drops the
/// GPU-/compute-instance ids, so the raw `nvmlEventSetWait_v2` is called through its symbol
/// table.
pub(super) struct EventWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EventWatch {
    pub(super) fn start(
        nvml: std::sync::Arc<Nvml>,
        targets: Vec<EventTarget>,
        sink: EventSink,
    ) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("nvml-events".into())
            .spawn(move || event_loop(&nvml, &targets, &sink, &flag))
            .ok();
        EventWatch { stop, thread }
    }
}

impl Drop for EventWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Delays between attempts to create the event set: 100 ms doubling to 30 s.
fn event_set_backoff() -> backon::ExponentialBackoff {
    backon::BackoffBuilder::build(
        backon::ExponentialBuilder::default()
            .with_min_delay(std::time::Duration::from_millis(100))
            .with_max_delay(std::time::Duration::from_secs(30))
            .without_max_times(),
    )
}

/// The raw event-set calls nvml-wrapper has no safe wrapper for, from NVML's symbol table.
#[derive(Clone, Copy)]
struct EventApi {
    create: unsafe extern "C" fn(*mut nvmlEventSet_t) -> nvmlReturn_t,
    register: unsafe extern "C" fn(nvmlDevice_t, c_ulonglong, nvmlEventSet_t) -> nvmlReturn_t,
    wait: unsafe extern "C" fn(nvmlEventSet_t, *mut nvmlEventData_t, c_uint) -> nvmlReturn_t,
    free: unsafe extern "C" fn(nvmlEventSet_t) -> nvmlReturn_t,
    /// `nvmlDeviceGetSupportedEventTypes`, when this NVML has it.
    supported: Option<unsafe extern "C" fn(nvmlDevice_t, *mut c_ulonglong) -> nvmlReturn_t>,
}

impl EventApi {
    /// The calls, or `None` when this NVML has no event API.
    fn load(nvml: &Nvml) -> Option<EventApi> {
        let lib = nvml.lib();
        let (Ok(create), Ok(register), Ok(wait), Ok(free)) = (
            lib.nvmlEventSetCreate.as_ref(),
            lib.nvmlDeviceRegisterEvents.as_ref(),
            lib.nvmlEventSetWait_v2.as_ref(),
            lib.nvmlEventSetFree.as_ref(),
        ) else {
            return None;
        };
        Some(EventApi {
            create: *create,
            register: *register,
            wait: *wait,
            free: *free,
            supported: lib.nvmlDeviceGetSupportedEventTypes.as_ref().ok().copied(),
        })
    }
}

/// Whether a GPU is watched is a health condition (fail closed while it is not), owned by the
/// supervisor's health tracker: reports it, keeps nothing here.
fn mark(sink: &EventSink, uuid: &str, failure: Option<String>) {
    sink(HealthEvent::Watched {
        uuid: uuid.to_string(),
        failure,
    });
}

// NVML FFI sites (the event-set calls nvml-wrapper has no safe wrapper for): each `unsafe`
// block below carries its SAFETY comment.
#[allow(unsafe_code)]
fn event_loop(
    nvml: &Nvml,
    targets: &[EventTarget],
    sink: &EventSink,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::Ordering;
    let Some(api) = EventApi::load(nvml) else {
        tracing::warn!(
            "this NVML has no event API; GPUs are watched by periodic NVML queries only"
        );
        return;
    };
    let mut delays = event_set_backoff();
    while !stop.load(Ordering::Relaxed) {
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: NVML's `nvmlEventSetCreate(nvmlEventSet_t *)`; `set` is a valid out pointer.
        if let Err(e) = nvml_try(unsafe { (api.create)(&mut set) }) {
            for t in targets {
                mark(sink, &t.uuid, Some(format!("nvmlEventSetCreate: {e}")));
            }
            let pause = delays.next().unwrap_or(std::time::Duration::from_secs(30));
            sleep_unless_stopped(stop, pause);
            continue;
        }
        let handles = register_all(nvml, api, targets, set, sink);
        delays = event_set_backoff();
        if wait_for_xids(api, set, &handles, sink, stop) == WaitEnd::Stopped {
            return;
        }
    }
}

/// Sleeps `pause` in slices so a stop request is honoured within EVENT_WAIT_MS.
fn sleep_unless_stopped(stop: &std::sync::atomic::AtomicBool, pause: std::time::Duration) {
    use std::sync::atomic::Ordering;
    let until = std::time::Instant::now() + pause;
    while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(u64::from(EVENT_WAIT_MS)).min(pause));
    }
}

/// Registers every GPU for Xid events on `set` (again, after a failed wait: re-checks all
/// before marking any) and marks each watched or not; returns the registered ones by handle.
#[allow(unsafe_code)]
fn register_all<'t>(
    nvml: &Nvml,
    api: EventApi,
    targets: &'t [EventTarget],
    set: nvmlEventSet_t,
    sink: &EventSink,
) -> Vec<(usize, &'t EventTarget)> {
    let mut handles = Vec::new();
    for t in targets {
        let device = match nvml.device_by_index(t.index) {
            Ok(d) => d,
            Err(e) => {
                mark(
                    sink,
                    &t.uuid,
                    Some(format!("nvmlDeviceGetHandleByIndex: {e}")),
                );
                continue;
            }
        };
        // SAFETY: the handle is valid while `nvml` lives.
        let handle = unsafe { device.handle() };
        match register_xids(api, handle, set) {
            Ok(()) => {
                mark(sink, &t.uuid, None);
                handles.push((handle as usize, t));
            }
            Err(NvmlError::NotSupported) => {
                mark(sink, &t.uuid, None);
                tracing::info!(gpu = %t.uuid, "GPU does not report Xid events; watched by periodic NVML queries");
            }
            Err(e) => {
                mark(
                    sink,
                    &t.uuid,
                    Some(format!("Xid event registration failed: {e}")),
                );
            }
        }
    }
    handles
}

/// Registers `handle` for Xid events on `set`; `NotSupported` when the GPU does not report
/// them (or its supported event types cannot be read).
#[allow(unsafe_code)]
fn register_xids(
    api: EventApi,
    handle: nvmlDevice_t,
    set: nvmlEventSet_t,
) -> Result<(), NvmlError> {
    let mut types: u64 = XID_CRITICAL_ERROR;
    if let Some(f) = api.supported {
        // SAFETY: `(nvmlDevice_t, unsigned long long *)`; `types` is a valid out pointer.
        if nvml_try(unsafe { f(handle, &mut types) }).is_err() {
            types = 0;
        }
    }
    if types & XID_CRITICAL_ERROR == 0 {
        Err(NvmlError::NotSupported)
    } else {
        // SAFETY: `(nvmlDevice_t, unsigned long long, nvmlEventSet_t)` with a live set.
        nvml_try(unsafe { (api.register)(handle, XID_CRITICAL_ERROR, set) })
    }
}

/// Why [`wait_for_xids`] returned (the set is freed either way).
#[derive(Debug, PartialEq, Eq)]
enum WaitEnd {
    /// A stop was requested.
    Stopped,
    /// A wait failed: the set must be re-created and every GPU re-checked.
    Failed,
}

/// Waits on `set` for Xid events of the registered `handles`, sending each to `sink` for the
/// devices it concerns, until a stop is requested or a wait fails; frees the set.
#[allow(unsafe_code)]
fn wait_for_xids(
    api: EventApi,
    set: nvmlEventSet_t,
    handles: &[(usize, &EventTarget)],
    sink: &EventSink,
    stop: &std::sync::atomic::AtomicBool,
) -> WaitEnd {
    use std::sync::atomic::Ordering;
    loop {
        if stop.load(Ordering::Relaxed) {
            // SAFETY: the set was created by the caller and is freed once.
            unsafe { (api.free)(set) };
            return WaitEnd::Stopped;
        }
        // SAFETY: all-zero is a valid `nvmlEventData_t` (a null handle and integers).
        let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: `(nvmlEventSet_t, nvmlEventData_t *, unsigned int)` with a live set.
        match nvml_try(unsafe { (api.wait)(set, &mut data, EVENT_WAIT_MS) }) {
            Ok(()) if data.eventType & XID_CRITICAL_ERROR != 0 => {
                let Some((_, t)) = handles.iter().find(|(h, _)| *h == data.device as usize) else {
                    continue;
                };
                for uuid in t.uuids_for(data.gpuInstanceId, data.computeInstanceId) {
                    sink(HealthEvent::Xid {
                        uuid: uuid.to_string(),
                        xid: data.eventData,
                    });
                }
            }
            Ok(()) | Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::error!(error = %crate::errors::chain(&e), "NVML event wait failed; re-creating the event set and re-checking every GPU");
                // SAFETY: the set was created by the caller and is freed once.
                unsafe { (api.free)(set) };
                return WaitEnd::Failed;
            }
        }
    }
}
