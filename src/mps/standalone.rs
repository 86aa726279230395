//! `slicelet mps --config FILE [--simulate NODE]`: the MPS supervisor alone, for a DaemonSet of
//! its own (with `slicelet run --mps-external` on the same node), so that rolling out the
//! device plugin never restarts running MPS servers.
//!
//! It is the supervisor's own loop ([`crate::daemon::run_target`] with
//! [`Target::Mps`]): the same policy reading, hashing, debounce, resync, SIGHUP, hardware
//! actor and plan, reconciled against the MPS control daemons and compute modes only (no
//! device-plugin servers, no status endpoint). An invalid policy keeps the daemons of the last
//! good one. On SIGTERM/SIGINT it sends `quit` to its daemons, removes their directories and
//! restores compute modes.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::daemon::{run_target, DaemonError, Target};
use crate::settings::Settings;
use crate::status::Status;

/// Runs the MPS supervisor until `shutdown` is cancelled.
///
/// # Errors
/// [`DaemonError`] when the GPUs cannot be discovered or a directory cannot be watched. An
/// invalid policy is not an error (it is logged and the last good one kept).
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<(), DaemonError> {
    run_target(
        settings,
        Target::Mps,
        shutdown,
        watch::channel(Status::default()).0,
    )
    .await
}
