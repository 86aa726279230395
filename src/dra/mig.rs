//! The channel DRA asks the hardware for MIG devices on (dynamic MIG, docs/mig.md): DRA owns
//! the request types, the daemon (a higher layer) serves them on its hardware actor thread,
//! one at a time and in order, so no two NVML MIG calls ever run at once, and rediscovers
//! after each create or destroy so the plan sees the new inventory.
//!
//! Three requests: [`MigRequest::Create`] and [`MigRequest::Destroy`] (the GPU source's
//! `create_mig` / `destroy_mig`), and [`MigRequest::Inventory`], a discovery answered after
//! every request queued before it: the plugin's start reconciles its checkpoint against it
//! (no create or destroy of an earlier run of the component is still in flight then).

use tokio::sync::{mpsc, oneshot};

use crate::inventory::{CreatedMig, Inventory, InventoryError};

/// One request to the hardware, with the channel its answer goes back on.
#[derive(Debug)]
pub enum MigRequest {
    /// Create a GPU instance of `profile` at memory slice `start` of GPU `gpu_uuid` and its
    /// full compute instance.
    Create {
        /// The parent GPU's `GPU-…` UUID.
        gpu_uuid: String,
        /// The profile as NVIDIA names it (`3g.40gb`).
        profile: String,
        /// The placement's first memory slice.
        start: u32,
        /// The new MIG device, or the driver's reason.
        reply: oneshot::Sender<Result<CreatedMig, InventoryError>>,
    },
    /// Destroy compute instance `ci_id` of GPU instance `gi_id` on GPU `gpu_uuid`, then the GPU
    /// instance (idempotent: one already gone is success).
    Destroy {
        /// The parent GPU's `GPU-…` UUID.
        gpu_uuid: String,
        /// The GPU instance id.
        gi_id: u32,
        /// The compute instance id.
        ci_id: u32,
        /// Done, or the driver's reason (`In use by another client` while a process runs on
        /// it).
        reply: oneshot::Sender<Result<(), InventoryError>>,
    },
    /// Discover now, after every request queued before this one.
    Inventory {
        /// The inventory; `None` when discovery failed (the daemon logs and reports why).
        reply: oneshot::Sender<Option<Inventory>>,
    },
}

/// Why a MIG request got no answer from the driver.
#[derive(Debug, thiserror::Error)]
pub enum MigCallError {
    /// The driver (or the simulated node) refused or failed; its reason.
    #[error(transparent)]
    Hardware(#[from] InventoryError),
    /// Nothing serves the requests: no hardware path (DRA without the daemon), or the
    /// hardware thread ended.
    #[error("no hardware path serves MIG requests (the hardware thread is not running)")]
    NoHardware,
    /// The discovery asked for failed (its error is the daemon's discovery error).
    #[error("discovering the GPUs failed")]
    NoInventory,
}

/// The sending side DRA holds (cheap to clone).
#[derive(Debug, Clone)]
pub struct MigClient {
    tx: mpsc::UnboundedSender<MigRequest>,
}

impl MigClient {
    /// A client and the receiver the hardware side serves.
    pub fn channel() -> (MigClient, mpsc::UnboundedReceiver<MigRequest>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (MigClient { tx }, rx)
    }

    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, InventoryError>>) -> MigRequest,
    ) -> Result<T, MigCallError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(make(reply))
            .map_err(|_| MigCallError::NoHardware)?;
        Ok(answer.await.map_err(|_| MigCallError::NoHardware)??)
    }

    /// Creates `profile` at `start` on `gpu_uuid` ([`MigRequest::Create`]).
    ///
    /// # Errors
    /// [`MigCallError`]: the driver's reason, or no hardware path.
    pub async fn create(
        &self,
        gpu_uuid: &str,
        profile: &str,
        start: u32,
    ) -> Result<CreatedMig, MigCallError> {
        self.call(|reply| MigRequest::Create {
            gpu_uuid: gpu_uuid.to_string(),
            profile: profile.to_string(),
            start,
            reply,
        })
        .await
    }

    /// Destroys GPU instance `gi_id` (compute instance `ci_id`) on `gpu_uuid`
    /// ([`MigRequest::Destroy`]).
    ///
    /// # Errors
    /// [`MigCallError`]: the driver's reason, or no hardware path.
    pub async fn destroy(
        &self,
        gpu_uuid: &str,
        gi_id: u32,
        ci_id: u32,
    ) -> Result<(), MigCallError> {
        self.call(|reply| MigRequest::Destroy {
            gpu_uuid: gpu_uuid.to_string(),
            gi_id,
            ci_id,
            reply,
        })
        .await
    }

    /// A discovery after every request queued before ([`MigRequest::Inventory`]).
    ///
    /// # Errors
    /// [`MigCallError`]: discovery failed, or no hardware path.
    pub async fn inventory(&self) -> Result<Inventory, MigCallError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(MigRequest::Inventory { reply })
            .map_err(|_| MigCallError::NoHardware)?;
        answer
            .await
            .map_err(|_| MigCallError::NoHardware)?
            .ok_or(MigCallError::NoInventory)
    }
}
