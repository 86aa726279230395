//! The kubelet's DRA resource health service (KEP-4680; `k8s.io/kubelet`
//! `pkg/apis/dra-health` v1 and v1alpha1), served on the DRA endpoint beside the DRA service.
//!
//! `NodeWatchResources` is one long-lived stream per kubelet. It sends the health of every
//! device of the pool ([`super::health_map::HealthMap`]; pool = the node, device = its name in the
//! slices) in one message: at once when the stream opens (as soon as there is a plan), then
//! whenever a device's health, cause or message changed (each new plan comes through the same
//! `watch` the slices are published from; nothing is polled), and again every
//! [`REFRESH`] without a change. Each device: `HEALTHY` or `UNHEALTHY`, `last_updated_time` =
//! when it last changed (Unix seconds), `health_check_timeout_seconds` = [`TIMEOUT`], and
//! `message` = why it is Unhealthy (at most [`crate::api::drahealth::MAX_MESSAGE`] characters).
//!
//! Why the refresh: the kubelet stamps each device with the time a message arrived and shows
//! it `Unknown` in pod status once `health_check_timeout_seconds` passed without another (its
//! default is 30 s). A stream that only spoke on change would turn every quiet device Unknown.
//! [`TIMEOUT`] is 60 s and the refresh comes every 20 s, so two refreshes may be late or lost
//! before the kubelet gives up on a device, and a hung slicelet shows as Unknown within a
//! minute.
//!
//! A stream ends when the kubelet goes away, when DRA shuts down, and when it has not taken a
//! message for [`SEND_TIMEOUT`] (a client that stopped reading: its buffers are returned).
//! At most [`MAX_STREAMS`] are open at once; one more is refused with `RESOURCE_EXHAUSTED`
//! (the kubelet opens one per plugin, and one more while a restarted kubelet's old connection
//! is still being torn down).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Semaphore};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::health_map::{unix_seconds, HealthMap};
use super::DraInput;
use crate::api::drahealth;
use crate::device_health::Health;

/// `health_check_timeout_seconds` of every device: how long the kubelet trusts a report.
pub const TIMEOUT: Duration = Duration::from_secs(60);
/// How often the full list is sent again when nothing changed (a third of [`TIMEOUT`]).
pub const REFRESH: Duration = Duration::from_secs(20);
/// Health streams served at once, at most.
pub const MAX_STREAMS: usize = 8;
/// How long a message may wait for its stream to take it before the stream is dropped: a
/// refresh period, so the kubelet, which reads at once, never meets it.
pub const SEND_TIMEOUT: Duration = REFRESH;

/// One device's entry in a message, before it becomes a version's proto.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The pool (the node).
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
    /// Healthy or Unhealthy (slicelet never reports UNKNOWN: every device of the pool has a
    /// verdict).
    pub health: Health,
    /// When it last changed, Unix seconds.
    pub last_updated: i64,
    /// Why, for people; empty when Healthy; at most 1024 characters.
    pub message: String,
}

/// The message for `health` in pool `pool`, in device-name order.
pub fn reports(pool: &str, health: &HealthMap) -> Vec<Report> {
    health
        .iter()
        .map(|(name, h)| Report {
            pool: pool.to_string(),
            device: name.clone(),
            health: h.health,
            last_updated: unix_seconds(h.since),
            message: h.message.chars().take(drahealth::MAX_MESSAGE).collect(),
        })
        .collect()
}

/// The health service for both versions: the pool's name, the plans, the shutdown, and the
/// streams' limits.
#[derive(Clone)]
pub struct HealthService {
    pool: String,
    inputs: watch::Receiver<Option<Arc<DraInput>>>,
    stop: CancellationToken,
    streams: Arc<Semaphore>,
    send_timeout: Duration,
}

impl HealthService {
    /// The service for pool `pool` (the node's name), its health from each new plan of
    /// `inputs` (`None` until the first); `stop` ends every stream (DRA is stopping). Limits:
    /// [`MAX_STREAMS`], [`SEND_TIMEOUT`].
    pub fn new(
        pool: String,
        inputs: watch::Receiver<Option<Arc<DraInput>>>,
        stop: CancellationToken,
    ) -> Self {
        HealthService {
            pool,
            inputs,
            stop,
            streams: Arc::new(Semaphore::new(MAX_STREAMS)),
            send_timeout: SEND_TIMEOUT,
        }
    }

    /// Opens a stream's task if a stream slot is free; `convert` makes one version's message
    /// of a report list.
    ///
    /// # Errors
    /// `RESOURCE_EXHAUSTED` when [`MAX_STREAMS`] are open.
    fn stream<M: Send + 'static>(
        &self,
        convert: fn(&[Report]) -> M,
    ) -> Result<mpsc::Receiver<Result<M, Status>>, Status> {
        let Ok(slot) = Arc::clone(&self.streams).try_acquire_owned() else {
            return Err(Status::resource_exhausted(format!(
                "{MAX_STREAMS} device-health streams are open on this plugin already; close one first"
            )));
        };
        let (tx, rx) = mpsc::channel(2);
        let mut inputs = self.inputs.clone();
        let stop = self.stop.clone();
        let pool = self.pool.clone();
        let send_timeout = self.send_timeout;
        tokio::spawn(async move {
            let _slot = slot;
            let deliver = |msg| deliver(&tx, &stop, send_timeout, msg);
            let mut last: Option<Vec<Report>> = None;
            let mut refresh =
                tokio::time::interval_at(tokio::time::Instant::now() + REFRESH, REFRESH);
            refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let input = inputs.borrow_and_update().clone();
                let now = input.map(|i| reports(&pool, &i.health));
                let send = match (&now, &last) {
                    (Some(n), Some(l)) => n != l,
                    (Some(_), None) => true,
                    (None, _) => false,
                };
                if send {
                    refresh.reset();
                    last = now;
                    if let Some(r) = &last {
                        if !deliver(convert(r)).await {
                            return;
                        }
                    }
                }
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = tx.closed() => return,
                    r = inputs.changed() => if r.is_err() { return },
                    _ = refresh.tick() => {
                        if let Some(r) = &last {
                            if !deliver(convert(r)).await {
                                return;
                            }
                        }
                    }
                }
            }
        });
        Ok(rx)
    }
}

/// Sends `msg`, waiting for room until DRA stops or for `limit` at most; false when the
/// stream is over (closed, DRA stopping, or a client that stopped reading).
async fn deliver<M>(
    tx: &mpsc::Sender<Result<M, Status>>,
    stop: &CancellationToken,
    limit: Duration,
    msg: M,
) -> bool {
    tokio::select! {
        biased;
        sent = tokio::time::timeout(limit, tx.send(Ok(msg))) => match sent {
            Ok(sent) => sent.is_ok(),
            Err(_) => {
                tracing::warn!(waited = ?limit, "DRA: a device-health stream took no message; dropping it");
                false
            }
        },
        () = stop.cancelled() => false,
    }
}

type HealthStream<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

macro_rules! health_version {
    ($v:ident) => {
        impl HealthService {
            #[allow(clippy::cast_possible_wrap)]
            fn $v(reports: &[Report]) -> drahealth::$v::NodeWatchResourcesResponse {
                use drahealth::$v as pb;
                pb::NodeWatchResourcesResponse {
                    devices: reports
                        .iter()
                        .map(|r| pb::DeviceHealth {
                            device: Some(pb::DeviceIdentifier {
                                pool_name: r.pool.clone(),
                                device_name: r.device.clone(),
                            }),
                            health: match r.health {
                                Health::Healthy => pb::HealthStatus::Healthy,
                                Health::Unhealthy => pb::HealthStatus::Unhealthy,
                            } as i32,
                            last_updated_time: r.last_updated,
                            health_check_timeout_seconds: TIMEOUT.as_secs() as i64,
                            message: r.message.clone(),
                        })
                        .collect(),
                }
            }
        }

        #[tonic::async_trait]
        impl drahealth::$v::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = HealthStream<drahealth::$v::NodeWatchResourcesResponse>;

            async fn node_watch_resources(
                &self,
                _request: Request<drahealth::$v::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                tracing::debug!(
                    version = stringify!($v),
                    "DRA: the kubelet watches device health"
                );
                let rx = self.stream(HealthService::$v)?;
                Ok(Response::new(Box::pin(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                )))
            }
        }
    };
}

health_version!(v1);
health_version!(v1alpha1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_health::Cause;
    use std::time::{SystemTime, UNIX_EPOCH};

    #[test]
    fn reports_name_the_pool_and_cut_the_message() {
        let mut health = HealthMap::new();
        health.insert(
            "gpu-b".to_string(),
            super::super::health_map::DeviceHealth {
                health: Health::Unhealthy,
                cause: Some(Cause::Xid(79)),
                message: "x".repeat(2000),
                since: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            },
        );
        health.insert(
            "gpu-a".to_string(),
            super::super::health_map::DeviceHealth {
                health: Health::Healthy,
                cause: None,
                message: String::new(),
                since: SystemTime::UNIX_EPOCH + Duration::from_secs(5),
            },
        );
        let r = reports("node-1", &health);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].device, "gpu-a");
        assert_eq!(r[1].pool, "node-1");
        assert_eq!(r[1].last_updated, 1_700_000_000);
        assert_eq!(r[1].message.chars().count(), drahealth::MAX_MESSAGE);
        let pb = HealthService::v1(&r);
        assert_eq!(
            pb.devices[0].health,
            drahealth::v1::HealthStatus::Healthy as i32
        );
        assert_eq!(
            pb.devices[1].health,
            drahealth::v1::HealthStatus::Unhealthy as i32
        );
        assert_eq!(pb.devices[1].health_check_timeout_seconds, 60);
        let alpha = HealthService::v1alpha1(&r);
        assert_eq!(
            alpha.devices[1].device.as_ref().unwrap().device_name,
            "gpu-b"
        );
    }

    /// A device `h` since `secs` after the epoch; an Unhealthy one lost.
    fn dev(h: Health, secs: u64) -> super::super::health_map::DeviceHealth {
        super::super::health_map::DeviceHealth {
            health: h,
            cause: (!h.is_healthy()).then_some(Cause::Lost),
            message: if h.is_healthy() {
                String::new()
            } else {
                "lost".to_string()
            },
            since: UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    /// The stream without sockets: the first message at once, the next on a change only (a
    /// plan that changes nothing of the health sends nothing), and the stream ends with DRA.
    #[tokio::test(start_paused = true)]
    async fn sends_first_then_on_change_and_refreshes() {
        let mut health = HealthMap::new();
        health.insert("gpu-a".to_string(), dev(Health::Healthy, 1));
        let input = |h: &HealthMap| {
            Some(Arc::new(DraInput {
                health: h.clone(),
                ..DraInput::default()
            }))
        };
        let (tx, rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let svc = HealthService::new("node-1".to_string(), rx, stop.clone());
        let mut stream = svc.stream(HealthService::v1).unwrap();
        // No plan yet: nothing.
        assert!(tokio::time::timeout(Duration::from_secs(1), stream.recv())
            .await
            .is_err());
        tx.send_replace(input(&health));
        let first = stream.recv().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 1);
        // The same health again (another plan): nothing new before the refresh.
        tx.send_replace(input(&health));
        assert!(tokio::time::timeout(Duration::from_secs(1), stream.recv())
            .await
            .is_err());
        health.insert("gpu-a".to_string(), dev(Health::Unhealthy, 50));
        tx.send_replace(input(&health));
        let second = stream.recv().await.unwrap().unwrap();
        assert_eq!(
            second.devices[0].health,
            drahealth::v1::HealthStatus::Unhealthy as i32
        );
        assert_eq!(second.devices[0].message, "lost");
        assert_eq!(second.devices[0].last_updated_time, 50);
        // Quiet: the same list again after REFRESH.
        let again = tokio::time::timeout(REFRESH + Duration::from_secs(1), stream.recv())
            .await
            .expect("no refresh")
            .unwrap()
            .unwrap();
        assert_eq!(again, second);
        stop.cancel();
        assert!(stream.recv().await.is_none(), "the stream ends with DRA");
    }

    fn one_device_input() -> Option<Arc<DraInput>> {
        let mut health = HealthMap::new();
        health.insert("gpu-a".to_string(), dev(Health::Healthy, 0));
        Some(Arc::new(DraInput {
            health,
            ..DraInput::default()
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn one_stream_past_the_cap_is_resource_exhausted_and_a_closed_one_frees_its_slot() {
        let (_tx, rx) = watch::channel(one_device_input());
        let svc = HealthService::new("node-1".to_string(), rx, CancellationToken::new());
        let mut open: Vec<_> = (0..MAX_STREAMS)
            .map(|_| svc.stream(HealthService::v1).unwrap())
            .collect();
        let refused = svc.stream(HealthService::v1).unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::ResourceExhausted,
            "{refused:?}"
        );
        // The client goes away: its task ends and gives its slot back.
        drop(open.pop());
        tokio::time::sleep(Duration::from_millis(1)).await;
        let again = svc.stream(HealthService::v1);
        assert!(again.is_ok(), "the closed stream's slot was not returned");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_takes_no_message_is_dropped_after_the_send_timeout() {
        let (_tx, rx) = watch::channel(one_device_input());
        let svc = HealthService::new("node-1".to_string(), rx, CancellationToken::new());
        let mut unread = svc.stream(HealthService::v1).unwrap();
        // Virtual time: the first message and two refreshes fill the channel (2) and the
        // third waits; SEND_TIMEOUT later the stream is given up.
        tokio::time::sleep(REFRESH * 2 + SEND_TIMEOUT + Duration::from_secs(1)).await;
        assert_eq!(
            svc.streams.available_permits(),
            MAX_STREAMS,
            "a stream nobody reads still holds its slot"
        );
        let mut buffered = 0;
        while let Some(m) = unread.recv().await {
            m.unwrap();
            buffered += 1;
        }
        assert_eq!(
            buffered, 2,
            "what was queued is all there is; then the stream ends"
        );
    }
}
