//! The DRA kubelet plugin: the registration socket the kubelet's plugin watcher finds, and
//! the DRA service the kubelet calls to prepare and unprepare claims.
//!
//! - `<--dra-registry-dir>/<driver>-reg.sock` serves `pluginregistration.Registration`:
//!   `GetInfo` answers type `DRAPlugin`, the driver name, the endpoint
//!   `<--dra-plugins-dir>/<driver>/dra.sock` and `supported_versions`
//!   [`crate::api::dra::SUPPORTED_VERSIONS`] (kubelets before 1.34 call only v1beta1; the
//!   health service, [`super::health_service`], as `v1.DRAResourceHealth` and
//!   `v1alpha1.DRAResourceHealth`).
//!   Every `GetInfo` and every `NotifyRegistrationStatus` that says registered counts as a
//!   registration: the publisher republishes (the kubelet deletes the node's slices when it
//!   starts and when a driver deregisters).
//! - The endpoint serves `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` and `.v1beta1.DRAPlugin`
//!   (the same messages) from one [`Plugin`], and `v1.DRAResourceHealth` and
//!   `v1alpha1.DRAResourceHealth` ([`super::health_service`]). The DRA socket is bound before the
//!   registration socket, so the kubelet never finds a plugin that does not answer yet.
//! - `NodePrepareResources`: per claim, an already prepared claim (by UID) gets its
//!   checkpointed answer again (its CDI spec rewritten if it went missing: `/var/run/cdi` is
//!   a tmpfs); otherwise the claim is fetched from the API (`get` on `resourceclaims`),
//!   checked and turned into a CDI spec by [`super::prepare::prepare`], the spec written
//!   atomically to `--cdi-output-dir`, and the claim added to the checkpoint. A failure is
//!   that claim's `error`; the call itself never fails.
//! - `NodeUnprepareResources`: removes the claim's spec and checkpoint entry; an unknown
//!   claim (never prepared, or unprepared already, or deleted from the API) is fine.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, Client};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::checkpoint::{self, Checkpoint, CheckpointError};
use super::prepare::{self, ClaimRef, PrepareError, PreparedDevice};
use super::{DraError, DraInput, DraSettings};
use crate::api;

mod dynamic;

/// The file name of the DRA service socket inside `<plugins dir>/<driver>/`.
pub const DRA_SOCKET: &str = "dra.sock";

/// The registration socket's path: `<registry>/<driver>-reg.sock`.
pub fn registration_socket(settings: &DraSettings) -> PathBuf {
    settings
        .registry_dir
        .join(format!("{}-reg.sock", settings.driver))
}

/// The driver's own directory: `<plugins dir>/<driver>` (DRA socket and checkpoint).
pub fn driver_dir(settings: &DraSettings) -> PathBuf {
    settings.plugins_dir.join(&settings.driver)
}

/// The DRA service socket's path: `<plugins dir>/<driver>/dra.sock`.
pub fn dra_socket(settings: &DraSettings) -> PathBuf {
    driver_dir(settings).join(DRA_SOCKET)
}

/// Longest socket path that fits `sockaddr_un.sun_path` (108 bytes with the NUL), bytes.
pub const MAX_SOCKET_PATH: usize = 107;

/// A bound socket file and its identity (only that file is removed at the end, not a newer
/// socket another process bound at the same path).
#[derive(Debug)]
pub struct Bound {
    /// The socket file.
    pub path: PathBuf,
    id: (u64, u64),
}

impl Bound {
    /// Removes the socket file if it is still ours.
    pub fn remove(&self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Binds `path`, creating its directory; a stale socket (nobody accepts) is replaced, a live
/// one or a file that is not a socket is an error.
///
/// # Errors
/// [`DraError::Bind`] naming the path.
pub fn bind(path: &Path) -> Result<(UnixListener, Bound), DraError> {
    let err = |message: String| DraError::Bind {
        path: path.to_path_buf(),
        message,
    };
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(err(format!(
            "over the {MAX_SOCKET_PATH}-byte unix socket path limit"
        )));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(err("served by another live process".to_string()));
            }
            let _ = std::fs::remove_file(path);
        }
        Ok(_) => return Err(err("exists and is not a socket".to_string())),
        Err(_) => {}
    }
    let listener = UnixListener::bind(path).map_err(|e| err(e.to_string()))?;
    let meta = std::fs::symlink_metadata(path).map_err(|e| err(e.to_string()))?;
    Ok((
        listener,
        Bound {
            path: path.to_path_buf(),
            id: (meta.dev(), meta.ino()),
        },
    ))
}

/// A checkpoint that cannot be read (corrupt, empty, a directory or FIFO in its place) is
/// renamed to `checkpoint.json.corrupt-<unix seconds>` (kept for inspection). Only a rename
/// that fails keeps DRA down.
fn set_aside(path: &Path, e: &CheckpointError) -> Result<PathBuf, DraError> {
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = path.with_file_name(format!("{}.corrupt-{at}", checkpoint::FILE));
    std::fs::rename(path, &aside).map_err(|source| DraError::SetAside {
        path: path.to_path_buf(),
        source,
    })?;
    tracing::error!(error = %crate::errors::chain(e), moved_to = %aside.display(),
        "DRA: the checkpoint cannot be used; set aside, the record of prepared claims rebuilt from the API (the kubelet does not prepare its running claims again)");
    Ok(aside)
}

/// The claims allocated from this node's pool by this driver, as the API has them
/// ([`checkpoint::rebuild`]): a cluster-wide `list` of ResourceClaims, and, when one of them
/// has devices of this pool, the node's ResourceSlices for each device's resource and ID (a
/// failed slice list leaves those empty; a new node's start, with none, asks nothing more).
///
/// # Errors
/// The claim list's error.
async fn from_api(settings: &DraSettings, client: &Client) -> Result<Checkpoint, kube::Error> {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let claims: Api<ResourceClaim> = Api::all(client.clone());
    let claims = claims.list(&kube::api::ListParams::default()).await?.items;
    let ours = claims.iter().any(|c| {
        c.status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .is_some_and(|r| {
                r.iter()
                    .any(|r| r.driver == settings.driver && r.pool == settings.node)
            })
    });
    if !ours {
        return Ok(checkpoint::rebuild(
            &claims,
            &[],
            &settings.driver,
            &settings.node,
        ));
    }
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let selector = format!(
        "spec.nodeName={},spec.driver={}",
        settings.node, settings.driver
    );
    let slices = match slices
        .list(&kube::api::ListParams::default().fields(&selector))
        .await
    {
        Ok(l) => l.items,
        Err(e) => {
            tracing::warn!(error = %crate::errors::chain(&e), "DRA: the node's ResourceSlices could not be listed; the rebuilt claims' devices are held by name only");
            Vec::new()
        }
    };
    Ok(checkpoint::rebuild(
        &claims,
        &slices,
        &settings.driver,
        &settings.node,
    ))
}

/// The prepared claims at start: the checkpoint at `path`; where it is missing or cannot be
/// used, the record rebuilt from the API ([`from_api`]) and written back. Temporary files of
/// the checkpoint's atomic writer left by a crash mid-write are removed first.
///
/// A corrupt file is set aside only once the API answered (else DRA stays down, retried, and
/// the file stays for the next try). A missing file whose rebuild fails (no `list` on
/// ResourceClaims) starts empty.
///
/// # Errors
/// [`DraError::Checkpoint`] for a file of another version or one that cannot be read;
/// [`DraError::Rebuild`] when the API does not answer for a corrupt file; a failed rename or
/// write.
pub async fn load_or_rebuild(
    settings: &DraSettings,
    client: &Client,
) -> Result<Checkpoint, DraError> {
    let path = driver_dir(settings).join(checkpoint::FILE);
    let removed = crate::files::remove_stale_temporaries(&path);
    if removed > 0 {
        tracing::info!(removed, path = %path.display(), "DRA: temporary files of an interrupted checkpoint write removed");
    }
    let corrupt = if path.exists() {
        match checkpoint::load(&path) {
            Ok(state) => return Ok(state),
            Err(e) if e.is_corrupt() => Some(e),
            Err(e) => return Err(DraError::Checkpoint(e)),
        }
    } else {
        None
    };
    let rebuilt = match (from_api(settings, client).await, &corrupt) {
        (Ok(c), _) => c,
        (Err(source), Some(_)) => {
            return Err(DraError::Rebuild { path, source });
        }
        (Err(e), None) => {
            tracing::warn!(error = %crate::errors::chain(&e), path = %path.display(),
                "DRA: no checkpoint, and the claims allocated from this node cannot be listed; starting with none prepared");
            return Ok(Checkpoint::new());
        }
    };
    if let Some(e) = &corrupt {
        set_aside(&path, e)?;
    }
    if rebuilt.claims.is_empty() {
        return Ok(rebuilt);
    }
    tracing::warn!(claims = rebuilt.claims.len(), path = %path.display(),
        "DRA: no usable checkpoint; the claims allocated from this node's pool and reserved for pods recorded as prepared from the API");
    checkpoint::save(&path, &rebuilt)?;
    Ok(rebuilt)
}

/// The plugin's state: the checkpoint, and where things go.
pub struct Plugin {
    settings: DraSettings,
    client: Client,
    inputs: watch::Receiver<Option<Arc<DraInput>>>,
    checkpoint_path: PathBuf,
    /// The one owner of the prepared claims; never held across an `.await`.
    state: Mutex<Checkpoint>,
    /// Where what is prepared is published (the supervisor's drain rules read it).
    status: watch::Sender<super::publish::PublishStatus>,
    /// The hardware's MIG requests (dynamic MIG); `None`: nothing serves them, so a claim for
    /// a dynamic MIG device fails with [`super::mig::MigCallError::NoHardware`].
    mig: Option<super::mig::MigClient>,
}

/// What staging a claim under the lock left to do.
enum Staging {
    /// Prepared (or prepared meanwhile): its devices.
    Done(Vec<PreparedDevice>),
    /// The dynamic MIG devices to create first (intents recorded and saved).
    Create(Vec<prepare::DynamicPick>),
}

impl Plugin {
    /// The plugin over `state`, the prepared claims [`load_or_rebuild`] read from
    /// `<plugins dir>/<driver>/checkpoint.json`; `mig`: where dynamic MIG devices are created
    /// (its records are reconciled by [`Plugin::reconcile_mig`] before the plugin serves).
    pub fn new(
        settings: DraSettings,
        client: Client,
        inputs: watch::Receiver<Option<Arc<DraInput>>>,
        status: watch::Sender<super::publish::PublishStatus>,
        mut state: Checkpoint,
        mig: Option<super::mig::MigClient>,
    ) -> Self {
        let checkpoint_path = driver_dir(&settings).join(checkpoint::FILE);
        // Paths come from validated UIDs only: an entry whose UID is not one, or whose spec
        // file is not the one its UID names (`../` in a tampered checkpoint), is dropped, so
        // prepare never writes and unprepare never removes outside `--cdi-output-dir`.
        state.claims.retain(|uid, c| {
            let ok = prepare::valid_uid(uid) && c.spec_file == prepare::spec_file(&settings.driver, uid);
            if !ok {
                tracing::warn!(claim = %crate::uuid::truncate_id(uid), spec_file = %crate::uuid::truncate_id(&c.spec_file),
                    path = %checkpoint_path.display(), "DRA: checkpoint entry dropped: its UID or spec file is not one slicelet writes");
            }
            ok
        });
        if !state.claims.is_empty() {
            tracing::info!(claims = state.claims.len(), path = %checkpoint_path.display(), "DRA: prepared claims reloaded from the checkpoint");
        }
        let prepared = checkpoint::holders(&state);
        let holds = state.dynamic_mig_holds();
        status.send_modify(|s| {
            s.prepared = Some(prepared);
            s.dynamic_mig = holds;
        });
        Plugin {
            settings,
            client,
            inputs,
            checkpoint_path,
            state: Mutex::new(state),
            status,
            mig,
        }
    }

    /// Publishes what `state` has prepared ([`super::publish::PublishStatus::prepared`]).
    /// Also the placements its dynamic MIG records hold
    /// ([`super::publish::PublishStatus::dynamic_mig`]).
    fn publish_prepared(&self, state: &Checkpoint) {
        let prepared = checkpoint::holders(state);
        let holds = state.dynamic_mig_holds();
        self.status.send_if_modified(|s| {
            let changed = s.prepared.as_ref() != Some(&prepared) || s.dynamic_mig != holds;
            s.prepared = Some(prepared);
            s.dynamic_mig = holds;
            changed
        });
    }

    /// Where claim `uid`'s CDI spec lives: `--cdi-output-dir` and the name the (validated) UID
    /// gives ([`prepare::spec_file`]); never a path read from the checkpoint.
    fn spec_path(&self, uid: &str) -> PathBuf {
        self.settings
            .cdi_dir
            .join(prepare::spec_file(&self.settings.driver, uid))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Checkpoint> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The checkpointed answer for `uid`, its spec rewritten when missing.
    fn already(&self, uid: &str) -> Option<Result<Vec<PreparedDevice>, ClaimError>> {
        let state = self.lock();
        let c = state.claims.get(uid).filter(|c| !c.rebuilt)?;
        let path = self.spec_path(uid);
        if !path.exists() {
            if let Err(e) = write_spec(&path, &c.spec) {
                return Some(Err(e));
            }
        }
        Some(Ok(c.devices.clone()))
    }

    /// Prepares each claim; the answer per UID.
    pub async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<String, Result<Vec<PreparedDevice>, ClaimError>> {
        let mut out = BTreeMap::new();
        for c in claims {
            let r = self.prepare_one(&c).await;
            if let Err(e) = &r {
                tracing::warn!(claim = %c, error = %claim_error(e), "DRA: NodePrepareResources refused a claim");
            }
            out.insert(c.uid.clone(), r);
        }
        out
    }

    async fn prepare_one(&self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, ClaimError> {
        prepare::check_claim_ref(c)?;
        if let Some(r) = self.already(&c.uid) {
            return r;
        }
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let claim = api.get(&c.name).await.map_err(|source| ClaimError::Get {
            claim: c.to_string(),
            source,
        })?;
        let input = self
            .inputs
            .borrow()
            .clone()
            .ok_or_else(|| ClaimError::NoPlan {
                claim: c.to_string(),
            })?;
        let to_create = match self.stage_or_commit(c, &claim, &input)? {
            Staging::Done(devices) => return Ok(devices),
            Staging::Create(picks) => picks,
        };
        // Never with the lock held: each create is awaited, its record saved before and after.
        for pick in &to_create {
            self.create_one(c, pick).await?;
        }
        self.commit_dynamic(c, &claim, &input)
    }

    /// The context claims are prepared against on `input`.
    fn context<'a>(&'a self, input: &'a DraInput) -> prepare::Context<'a> {
        prepare::Context {
            plan: &input.plan,
            inventory: &input.inventory,
            node: &self.settings.node,
            driver: &self.settings.driver,
            dev_root: &self.settings.dev_root,
            memory_hook: self.settings.memory_hook.as_ref(),
        }
    }

    /// Checks and stages claim `c` under the lock: a claim without dynamic MIG devices is
    /// prepared and committed at once ([`Staging::Done`]); one with them gets an intent
    /// record per device still to create, saved ([`Staging::Create`]).
    fn stage_or_commit(
        &self,
        c: &ClaimRef,
        claim: &ResourceClaim,
        input: &DraInput,
    ) -> Result<Staging, ClaimError> {
        let mut state = self.lock();
        // Prepared meanwhile by a concurrent call: the same answer. A record rebuilt from the
        // API is prepared afresh (it has no answer), and replaced.
        if let Some(p) = state.claims.get(&c.uid).filter(|p| !p.rebuilt) {
            return Ok(Staging::Done(p.devices.clone()));
        }
        let held = state.held(&c.uid);
        let staged = prepare::stage(claim, c, &self.context(input), &held)?;
        if staged.dynamic.is_empty() {
            let prepared = staged.finish(&BTreeMap::new());
            return self.commit(&mut state, c, prepared).map(Staging::Done);
        }
        self.record_intents(&mut state, c, &staged.dynamic)
            .map(Staging::Create)
    }

    /// Writes `prepared`'s spec, records the claim and saves; on a failed save the claim's
    /// record is as before and the spec removed.
    fn commit(
        &self,
        state: &mut Checkpoint,
        c: &ClaimRef,
        prepared: prepare::PreparedClaim,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        let before = state.claims.get(&c.uid).cloned();
        let path = self.spec_path(&c.uid);
        write_spec(&path, &prepared.spec)?;
        let devices = prepared.devices.clone();
        state.claims.insert(c.uid.clone(), prepared);
        if let Err(e) = checkpoint::save(&self.checkpoint_path, state) {
            match before {
                Some(b) => state.claims.insert(c.uid.clone(), b),
                None => state.claims.remove(&c.uid),
            };
            let _ = std::fs::remove_file(&path);
            return Err(ClaimError::Checkpoint {
                claim: c.to_string(),
                source: e,
            });
        }
        self.publish_prepared(state);
        tracing::info!(claim = %c, devices = devices.len(), spec = %path.display(), "DRA: claim prepared");
        Ok(devices)
    }

    /// Unprepares each claim; the answer per UID.
    pub async fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<String, Result<(), ClaimError>> {
        let mut out = BTreeMap::new();
        for c in claims {
            let r = match self.destroy_dynamic(&c).await {
                Ok(()) => self.unprepare_one(&c),
                Err(e) => Err(e),
            };
            if let Err(e) = &r {
                tracing::warn!(claim = %c, error = %claim_error(e), "DRA: NodeUnprepareResources failed for a claim");
            }
            out.insert(c.uid.clone(), r);
        }
        out
    }

    fn unprepare_one(&self, c: &ClaimRef) -> Result<(), ClaimError> {
        if !prepare::valid_uid(&c.uid) {
            // Never prepared: nothing to undo.
            return Ok(());
        }
        let mut state = self.lock();
        let path = self.spec_path(&c.uid);
        // Nothing there is nothing to undo, even where the directory cannot be written (a
        // read-only CDI overlay answers EROFS to any unlink, the path there or not).
        let there = std::fs::symlink_metadata(&path).is_ok();
        if there {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(ClaimError::RemoveSpec {
                        claim: c.to_string(),
                        path,
                        source,
                    })
                }
            }
        }
        if let Some(old) = state.claims.remove(&c.uid) {
            if let Err(e) = checkpoint::save(&self.checkpoint_path, &state) {
                state.claims.insert(c.uid.clone(), old);
                return Err(ClaimError::Checkpoint {
                    claim: c.to_string(),
                    source: e,
                });
            }
            self.publish_prepared(&state);
            tracing::info!(claim = %c, "DRA: claim unprepared");
        }
        Ok(())
    }

    /// The UIDs of the prepared claims.
    pub fn prepared(&self) -> Vec<String> {
        self.lock().claims.keys().cloned().collect()
    }
}

fn write_spec(path: &Path, spec: &serde_json::Value) -> Result<(), ClaimError> {
    let text = serde_json::to_vec_pretty(spec).map_err(ClaimError::Encode)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ClaimError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    crate::files::write_atomic(path, &text).map_err(|source| ClaimError::WriteSpec {
        path: path.to_path_buf(),
        source,
    })
}

/// Why one claim was not prepared or unprepared. The kubelet gets it as the claim's `error`
/// string ([`claim_error`]) and retries the claim; the pod's events show it.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The claim's reference, its allocation, or the devices it names were refused (boxed:
    /// the largest variant by far).
    #[error(transparent)]
    Refused(Box<PrepareError>),
    /// The claim could not be read from the API server.
    #[error("claim {claim}: getting it from the API")]
    Get {
        /// `namespace/name (uid)`.
        claim: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// No plan has been made yet (slicelet is starting).
    #[error("claim {claim}: no plan yet; the kubelet retries")]
    NoPlan {
        /// `namespace/name (uid)`.
        claim: String,
    },
    /// The checkpoint could not be saved: the claim's state is as before the call.
    #[error("claim {claim}")]
    Checkpoint {
        /// `namespace/name (uid)`.
        claim: String,
        /// Why.
        #[source]
        source: CheckpointError,
    },
    /// The claim's CDI spec could not be removed.
    #[error("claim {claim}: removing {}", path.display())]
    RemoveSpec {
        /// `namespace/name (uid)`.
        claim: String,
        /// The spec file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A dynamic MIG device could not be created (the kubelet retries the claim).
    #[error("claim {claim}: creating MIG device {device}")]
    MigCreate {
        /// `namespace/name (uid)`.
        claim: String,
        /// The published device name.
        device: String,
        /// The driver's reason, or no hardware path (boxed: the largest error by far).
        #[source]
        source: Box<crate::dra::mig::MigCallError>,
    },
    /// A dynamic MIG device could not be destroyed (a process still on it: `In use by another
    /// client`); its record stays `destroying` and the kubelet's retry destroys it.
    #[error("claim {claim}: destroying MIG device {device}")]
    MigDestroy {
        /// `namespace/name (uid)`.
        claim: String,
        /// The published device name.
        device: String,
        /// The driver's reason, or no hardware path (boxed: the largest error by far).
        #[source]
        source: Box<crate::dra::mig::MigCallError>,
    },
    /// Another call is creating or destroying the claim's dynamic MIG devices (the kubelet
    /// retries).
    #[error(
        "claim {claim}: its MIG devices are being created or destroyed by another call; retried"
    )]
    InProgress {
        /// `namespace/name (uid)`.
        claim: String,
    },
    /// The claim's CDI spec could not be encoded.
    #[error(transparent)]
    Encode(serde_json::Error),
    /// The CDI output directory could not be created.
    #[error("creating {}", dir.display())]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The claim's CDI spec could not be written.
    #[error("writing {}", path.display())]
    WriteSpec {
        /// The spec file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl From<PrepareError> for ClaimError {
    fn from(e: PrepareError) -> Self {
        ClaimError::Refused(Box::new(e))
    }
}

/// The claim's `error` string in a NodePrepareResources or NodeUnprepareResources answer:
/// the error and each of its causes, `: `-separated ([`crate::errors::chain`]). The kubelet
/// keeps it in the pod's events; it names the claim and what to fix.
pub fn claim_error(e: &ClaimError) -> String {
    crate::errors::chain(e)
}

/// The gRPC face of a [`Plugin`], for both API versions.
#[derive(Clone)]
pub struct Service(pub Arc<Plugin>);

macro_rules! dra_version {
    ($v:ident) => {
        #[tonic::async_trait]
        impl api::dra::$v::dra_plugin_server::DraPlugin for Service {
            async fn node_prepare_resources(
                &self,
                request: Request<api::dra::$v::NodePrepareResourcesRequest>,
            ) -> Result<Response<api::dra::$v::NodePrepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| ClaimRef {
                        namespace: c.namespace,
                        name: c.name,
                        uid: c.uid,
                    })
                    .collect();
                // On a task of its own: a kubelet that gives up on the call (its timeout) does
                // not cancel a create half way; the claim's retry finds it done.
                let plugin = Arc::clone(&self.0);
                let answers = tokio::spawn(async move { plugin.prepare(claims).await })
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?;
                let claims = answers
                    .into_iter()
                    .map(|(uid, r)| {
                        let resp = match r {
                            Ok(devices) => api::dra::$v::NodePrepareResourceResponse {
                                devices: devices
                                    .into_iter()
                                    .map(api::dra::$v::Device::from)
                                    .collect(),
                                error: String::new(),
                            },
                            Err(e) => api::dra::$v::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error: claim_error(&e),
                            },
                        };
                        (uid, resp)
                    })
                    .collect();
                Ok(Response::new(api::dra::$v::NodePrepareResourcesResponse {
                    claims,
                }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<api::dra::$v::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<api::dra::$v::NodeUnprepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| ClaimRef {
                        namespace: c.namespace,
                        name: c.name,
                        uid: c.uid,
                    })
                    .collect();
                let plugin = Arc::clone(&self.0);
                let answers = tokio::spawn(async move { plugin.unprepare(claims).await })
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?;
                let claims = answers
                    .into_iter()
                    .map(|(uid, r)| {
                        (
                            uid,
                            api::dra::$v::NodeUnprepareResourceResponse {
                                error: r.err().map(|e| claim_error(&e)).unwrap_or_default(),
                            },
                        )
                    })
                    .collect();
                Ok(Response::new(
                    api::dra::$v::NodeUnprepareResourcesResponse { claims },
                ))
            }
        }
    };
}

dra_version!(v1);
dra_version!(v1beta1);

impl From<PreparedDevice> for api::dra::v1::Device {
    /// With the share's ID on a consumable-capacity device (v1 only).
    fn from(d: PreparedDevice) -> Self {
        api::dra::v1::Device {
            request_names: d.requests,
            pool_name: d.pool,
            device_name: d.device,
            cdi_device_ids: d.cdi_ids,
            share_id: d.share.map(|s| s.id).filter(|id| !id.is_empty()),
        }
    }
}

impl From<PreparedDevice> for api::dra::v1beta1::Device {
    /// v1beta1 has no share IDs (kubelets before 1.34, which have no consumable capacity).
    fn from(d: PreparedDevice) -> Self {
        api::dra::v1beta1::Device {
            request_names: d.requests,
            pool_name: d.pool,
            device_name: d.device,
            cdi_device_ids: d.cdi_ids,
        }
    }
}

/// `pluginregistration.Registration` for the driver.
pub struct Registrar {
    /// The driver name.
    pub driver: String,
    /// The DRA socket's path (the `endpoint` answered).
    pub endpoint: PathBuf,
    /// Bumped on every registration (GetInfo, or NotifyRegistrationStatus registered).
    pub registrations: watch::Sender<u64>,
}

#[tonic::async_trait]
impl api::pluginregistration::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _request: Request<api::pluginregistration::InfoRequest>,
    ) -> Result<Response<api::pluginregistration::PluginInfo>, Status> {
        self.registrations.send_modify(|n| *n += 1);
        Ok(Response::new(api::pluginregistration::PluginInfo {
            r#type: api::pluginregistration::DRA_PLUGIN.to_string(),
            name: self.driver.clone(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: api::dra::SUPPORTED_VERSIONS
                .iter()
                .map(|v| (*v).to_string())
                .collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<api::pluginregistration::RegistrationStatus>,
    ) -> Result<Response<api::pluginregistration::RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            tracing::info!(driver = %self.driver, "DRA: registered with the kubelet");
            self.registrations.send_modify(|n| *n += 1);
        } else {
            tracing::error!(driver = %self.driver, error = %s.error, "DRA: the kubelet refused the registration");
        }
        Ok(Response::new(
            api::pluginregistration::RegistrationStatusResponse {},
        ))
    }
}
