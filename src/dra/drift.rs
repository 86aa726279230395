//! Whether somebody else changed this node's ResourceSlices since the publisher last wrote
//! them: the kubelet deletes every slice of its node when it starts (once it can read its
//! Node object, retried with backoff: that can be seconds after the plugin registered again
//! and the slices were published), an operator deletes one, another writer replaces one.
//! Without a watch such a change lasted until the next plan change or registration.
//!
//! [`watch`] starts a task with kube-runtime's watcher on this node's and driver's slices
//! (field selector `spec.nodeName=<node>,spec.driver=<driver>`, metadata only: the API server
//! sends names and `resourceVersion`s, not the devices; its LISTs from the watch cache,
//! `resourceVersion=0`). It forwards every event to the publisher, and a failure as
//! [`Seen::Broken`], after which it starts a new watcher (a LIST first) after a backoff
//! (0.8 s doubling to 30 s, reset by an answer).
//!
//! [`View`] (pure) keeps what the watch shows, slice name → `resourceVersion`, and compares it
//! with the publisher's own copies (its writes' answers and the listed slices it kept):
//! - the two agree: nothing to do;
//! - an event changes a slice whose watched version was the publisher's own: somebody else
//!   wrote or deleted it after the publisher's write (a watch delivers a slice's changes in
//!   order), [`Verdict::Drifted`] at once;
//! - they disagree otherwise: the watch may still be on its way to the publisher's latest
//!   writes (or its LIST came from before them), [`Verdict::Lags`]; the publisher gives it
//!   [`AGREE_WITHIN`] and treats a disagreement that outlasts it as drift (the window doubles,
//!   to [`AGREE_MAX`], while disagreements keep outlasting it, and is reset by an agreement).
//!
//! A drift makes the publisher list its slices again and reconcile (a slice gone is created
//! again, one rewritten is replaced). While the watch is broken, or before its first LIST,
//! nothing is compared (a registration or plan change still lists again, as before).
//! RBAC: `list` and `watch` on `resourceslices`.

use std::collections::BTreeMap;
use std::pin::pin;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

/// How long the watch's view may disagree with the publisher's copies before the publisher
/// lists and reconciles again: far longer than a watch event takes to arrive on a busy API
/// server, short next to the time a pod waits for a device.
pub const AGREE_WITHIN: Duration = Duration::from_secs(5);

/// The longest the window grows to when disagreements outlast it again and again (a watch
/// that never catches up, say): the publisher then lists at most once per this window.
pub const AGREE_MAX: Duration = Duration::from_secs(300);

/// Slice name → `resourceVersion`.
pub type Versions = BTreeMap<String, String>;

/// What the watch task sends the publisher: its events, each slice by name and
/// `resourceVersion`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A LIST starts (the first, or again after the watch fell too far behind).
    Listing,
    /// A slice the LIST shows: name, version.
    Listed(String, String),
    /// The LIST is complete.
    ListDone,
    /// A slice was created or replaced: name, version.
    Applied(String, String),
    /// A slice was deleted: its name.
    Deleted(String),
    /// The watch failed (the error chain); the watcher retries after a backoff.
    Broken(String),
}

impl Seen {
    /// The watch event `ev` (`None` for a slice without a name, which the API server never
    /// sends).
    fn of(ev: Event<PartialObjectMeta<ResourceSlice>>) -> Option<Seen> {
        Some(match ev {
            Event::Init => Seen::Listing,
            Event::InitApply(m) => {
                let (name, version) = key(&m)?;
                Seen::Listed(name, version)
            }
            Event::InitDone => Seen::ListDone,
            Event::Apply(m) => {
                let (name, version) = key(&m)?;
                Seen::Applied(name, version)
            }
            Event::Delete(m) => Seen::Deleted(key(&m)?.0),
        })
    }
}

/// What the watch's view says about the publisher's copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// They agree, or there is nothing to compare (no copies, no synced view).
    Agrees,
    /// They disagree, but the watch may not have caught up yet.
    Lags,
    /// Somebody else changed the slices.
    Drifted,
}

/// The watch's view of this node's slices.
#[derive(Debug, Default)]
pub struct View {
    /// What the watch shows (after its first complete LIST).
    seen: Versions,
    /// Whether `seen` is the watch's current view: set by a complete LIST and by every change
    /// event, cleared by a failure.
    synced: bool,
    /// The versions a LIST under way has shown so far.
    listing: Option<Versions>,
}

impl View {
    /// Folds `seen` into the view and judges the publisher's `copies` (`None`: it has none,
    /// because it lists at its next reconcile anyway).
    pub fn observe(&mut self, seen: Seen, copies: Option<&Versions>) -> Verdict {
        match seen {
            Seen::Broken(_) => {
                self.synced = false;
                Verdict::Agrees
            }
            Seen::Listing => {
                self.listing = Some(Versions::new());
                Verdict::Agrees
            }
            Seen::Listed(name, version) => {
                if let Some(listing) = self.listing.as_mut() {
                    listing.insert(name, version);
                }
                Verdict::Agrees
            }
            Seen::ListDone => {
                self.seen = self.listing.take().unwrap_or_default();
                self.synced = true;
                self.judge(copies)
            }
            Seen::Applied(name, version) => self.change(name, Some(version), copies),
            Seen::Deleted(name) => self.change(name, None, copies),
        }
    }

    /// Slice `name` applied at `version`, or deleted (`None`).
    fn change(
        &mut self,
        name: String,
        version: Option<String>,
        copies: Option<&Versions>,
    ) -> Verdict {
        let was_ours = self.synced
            && copies
                .is_some_and(|c| c.contains_key(&name) && c.get(&name) == self.seen.get(&name));
        match version {
            Some(version) => {
                self.seen.insert(name.clone(), version);
            }
            None => {
                self.seen.remove(&name);
            }
        }
        self.synced = true;
        if was_ours && copies.and_then(|c| c.get(&name)) != self.seen.get(&name) {
            return Verdict::Drifted;
        }
        self.judge(copies)
    }

    /// The view against `copies` as a whole.
    pub fn judge(&self, copies: Option<&Versions>) -> Verdict {
        match copies {
            Some(c) if self.synced && *c != self.seen => Verdict::Lags,
            _ => Verdict::Agrees,
        }
    }
}

/// A slice's name and `resourceVersion` (`None` without a name).
fn key(m: &PartialObjectMeta<ResourceSlice>) -> Option<(String, String)> {
    Some((
        m.metadata.name.clone()?,
        m.metadata.resource_version.clone().unwrap_or_default(),
    ))
}

/// The versions of `slices` (the publisher's copies).
pub fn versions_of(slices: &[ResourceSlice]) -> Versions {
    slices
        .iter()
        .filter_map(|s| {
            Some((
                s.metadata.name.clone()?,
                s.metadata.resource_version.clone().unwrap_or_default(),
            ))
        })
        .collect()
}

/// Starts the watch of `node`'s slices of `driver` on the current tokio runtime until `stop`
/// or until the receiver is dropped;
/// its events arrive on the receiver (a few buffered: the watch waits while the publisher
/// writes).
pub fn watch(
    client: Client,
    node: &str,
    driver: &str,
    stop: CancellationToken,
) -> mpsc::Receiver<Seen> {
    let (tx, rx) = mpsc::channel(16);
    let selector = format!("spec.nodeName={node},spec.driver={driver}");
    let publisher = tx.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            // The publisher gone (its task ended): the watch goes with it.
            () = publisher.closed() => {}
            () = run(client, selector, tx) => {}
        }
    });
    rx
}

async fn run(client: Client, selector: String, tx: mpsc::Sender<Seen>) {
    let api: Api<PartialObjectMeta<ResourceSlice>> = Api::all(client);
    // From the watch cache, unpaged (kube sends no `limit` then; one node's slices are few).
    let mut config = watcher::Config::default().fields(&selector).any_semantic();
    config.page_size = None;
    let mut backoff = crate::k8s::retry_backoff();
    let mut last_error: Option<String> = None;
    loop {
        // A new watcher after every failure: it lists first, so a view that may have missed
        // changes meanwhile is replaced, and its complete LIST says the watch works again.
        let mut events = pin!(watcher::watcher(api.clone(), config.clone()));
        while let Some(ev) = events.next().await {
            let seen = match ev {
                Ok(ev) => {
                    if matches!(ev, Event::InitDone | Event::Apply(_) | Event::Delete(_)) {
                        backoff = crate::k8s::retry_backoff();
                        if last_error.take().is_some() {
                            tracing::info!(selector = %selector, "DRA: watching the ResourceSlices again");
                        }
                    }
                    let Some(seen) = Seen::of(ev) else { continue };
                    seen
                }
                Err(e) => {
                    let error = crate::errors::chain(&e);
                    if last_error.as_deref() != Some(error.as_str()) {
                        tracing::warn!(error = %error, selector = %selector, "DRA: watching the ResourceSlices failed; a slice somebody else deletes is published again only at the next change or registration until the watch works again (retried with backoff)");
                    }
                    last_error = Some(error.clone());
                    if tx.send(Seen::Broken(error)).await.is_err() {
                        return;
                    }
                    break;
                }
            };
            if tx.send(seen).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(backoff.next().unwrap_or(crate::k8s::RETRY_MAX)).await;
    }
}

#[cfg(test)]
mod tests;
