//! What is in use, from the kubelet's pod-resources API: reads (`List`) for
//! [`super::Action::RefreshInUse`], the periodic refresh and each Allocate, each answered on the
//! channel the supervisor waits on.

use std::path::PathBuf;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::in_use::InUse;
use crate::podres::client::PodResourcesError;

/// One read's answer: what is in use, or why it could not be read.
pub(super) type Answer = Result<InUse, PodResourcesError>;

/// Reads of what is in use: one at a time and at least [`crate::podres::client::MIN_SPACING`]
/// apart (the kubelet's limit is 100 a second), a request while one runs queued once.
pub(super) struct InUseReader {
    socket: Option<PathBuf>,
    tx: mpsc::Sender<Answer>,
    busy: bool,
    again: bool,
    last: Option<Instant>,
}

impl InUseReader {
    /// Reads of `socket` (`None`: no source, nothing is ever read), answered on `tx`.
    pub(super) fn new(socket: Option<PathBuf>, tx: mpsc::Sender<Answer>) -> Self {
        InUseReader {
            socket,
            tx,
            busy: false,
            again: false,
            last: None,
        }
    }

    /// Whether there is a pod-resources socket to read.
    pub(super) fn has_source(&self) -> bool {
        self.socket.is_some()
    }

    /// Whether a read runs (its answer not handed back through [`InUseReader::answered`] yet).
    pub(super) fn is_busy(&self) -> bool {
        self.busy
    }

    /// Starts a read, or queues one behind the read that runs.
    pub(super) fn start(&mut self) {
        let Some(socket) = self.socket.clone() else {
            return;
        };
        if self.busy {
            self.again = true;
            return;
        }
        self.busy = true;
        // No socket, no request: answered at once (and not spaced, the kubelet's rate limit
        // counts requests).
        if std::fs::symlink_metadata(&socket).is_err() {
            let e = PodResourcesError::Missing { path: socket };
            let _ = self.tx.try_send(Err(e));
            return;
        }
        let now = Instant::now();
        let at = self
            .last
            .map_or(now, |l| (l + crate::podres::client::MIN_SPACING).max(now));
        self.last = Some(at);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let answer = crate::podres::client::list(&socket).await;
            let _ = tx.send(answer).await;
        });
    }

    /// The read that ran has answered `answer`: `Some(answer)` to fold, or `None` when a read
    /// was asked for while it ran (a plan that withdraws devices waits on it, or an Allocate
    /// came): this answer may predate that, so the queued read starts and only its answer
    /// counts.
    pub(super) fn answered(&mut self, answer: Answer) -> Option<Answer> {
        self.busy = false;
        if std::mem::take(&mut self.again) {
            self.start();
            None
        } else {
            Some(answer)
        }
    }

    /// The read asked at start has answered: it is folded whatever was queued meanwhile (the
    /// queued request stays queued for the next read).
    pub(super) fn answered_first(&mut self) {
        self.busy = false;
    }
}
