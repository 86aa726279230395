//! The kubelet's DRA resource health service (KEP-4680; `k8s.io/kubelet`
//! `pkg/apis/dra-health` v1 and v1alpha1), served on the DRA endpoint beside the DRA service.
//!
//! `NodeWatchResources` is one long-lived stream per kubelet. It sends the health of every
//! device of the pool ([`super::health::HealthMap`]; pool = the node, device = its name in the
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
//! A stream ends when the kubelet goes away (or stops reading) and when DRA shuts down.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::health::{unix_seconds, HealthMap};
use super::DraInput;
use crate::api::drahealth;
use crate::health::Health;

/// `health_check_timeout_seconds` of every device: how long the kubelet trusts a report.
pub const TIMEOUT: Duration = Duration::from_secs(60);
/// How often the full list is sent again when nothing changed (a third of [`TIMEOUT`]).
pub const REFRESH: Duration = Duration::from_secs(20);

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

/// The health service for both versions: the pool's name, the plans, the shutdown.
#[derive(Clone)]
pub struct HealthService {
    /// The pool (the node's name).
    pub pool: String,
    /// Each new plan (`None` until the first).
    pub inputs: watch::Receiver<Option<Arc<DraInput>>>,
    /// Ends every stream (DRA is stopping).
    pub stop: CancellationToken,
}

impl HealthService {
    /// Spawns the stream's task; `convert` makes one version's message of a report list.
    fn stream<M: Send + 'static>(
        &self,
        convert: fn(&[Report]) -> M,
    ) -> mpsc::Receiver<Result<M, Status>> {
        let (tx, rx) = mpsc::channel(2);
        let mut inputs = self.inputs.clone();
        let stop = self.stop.clone();
        let pool = self.pool.clone();
        tokio::spawn(async move {
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
                        if !deliver(&tx, &stop, convert(r)).await {
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
                            if !deliver(&tx, &stop, convert(r)).await {
                                return;
                            }
                        }
                    }
                }
            }
        });
        rx
    }
}

/// Sends `msg`, waiting for room only until DRA stops; false when the stream is over.
async fn deliver<M>(
    tx: &mpsc::Sender<Result<M, Status>>,
    stop: &CancellationToken,
    msg: M,
) -> bool {
    tokio::select! {
        biased;
        sent = tx.send(Ok(msg)) => sent.is_ok(),
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
                let rx = self.stream(HealthService::$v);
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
    use crate::health::Cause;
    use std::time::{SystemTime, UNIX_EPOCH};

    #[test]
    fn reports_name_the_pool_and_cut_the_message() {
        let mut health = HealthMap::new();
        health.insert(
            "gpu-b".to_string(),
            super::super::health::DeviceHealth {
                health: Health::Unhealthy,
                cause: Some(Cause::Xid(79)),
                message: "x".repeat(2000),
                since: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            },
        );
        health.insert(
            "gpu-a".to_string(),
            super::super::health::DeviceHealth {
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

    /// The stream without sockets: the first message at once, the next on a change only (a
    /// plan that changes nothing of the health sends nothing), and the stream ends with DRA.
    #[tokio::test(start_paused = true)]
    async fn sends_first_then_on_change_and_refreshes() {
        let mut health = HealthMap::new();
        let dev = |h: Health, secs: u64| super::super::health::DeviceHealth {
            health: h,
            cause: (!h.is_healthy()).then_some(Cause::Lost),
            message: if h.is_healthy() {
                String::new()
            } else {
                "lost".to_string()
            },
            since: UNIX_EPOCH + Duration::from_secs(secs),
        };
        health.insert("gpu-a".to_string(), dev(Health::Healthy, 1));
        let input = |h: &HealthMap| {
            Some(Arc::new(DraInput {
                health: h.clone(),
                ..DraInput::default()
            }))
        };
        let (tx, rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let svc = HealthService {
            pool: "node-1".to_string(),
            inputs: rx,
            stop: stop.clone(),
        };
        let mut stream = svc.stream(HealthService::v1);
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
}
