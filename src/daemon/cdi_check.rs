//! The CDI watch: reads of the node's CDI spec directories for [`super::Action::CheckCdi`],
//! one at a time on a blocking thread, each answered as a [`CdiAnswer`] on the channel the
//! supervisor waits on.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

/// What a read of the CDI spec directories reports: [`CdiAnswer::Slow`] once when it runs past
/// [`super::CDI_READ_DEADLINE`] (the last answer stays in force meanwhile), then
/// [`CdiAnswer::Done`].
#[derive(Debug)]
pub(super) enum CdiAnswer {
    /// The read runs past its deadline (said once).
    Slow,
    /// The read finished.
    Done(crate::cdi::SpecIndex),
}

/// How the CDI spec directories are read (blocking); [`crate::cdi::read_specs`] but in tests.
type SpecReader = Arc<dyn Fn(&[PathBuf]) -> crate::cdi::SpecIndex + Send + Sync>;

/// Reads of the CDI spec directories for [`super::Action::CheckCdi`]: one at a time, on a blocking
/// thread, until it finishes (a read past its deadline is reported, never abandoned and
/// started again beside itself); a request while one runs is queued once.
pub(super) struct CdiCheck {
    dirs: Vec<PathBuf>,
    tx: mpsc::Sender<CdiAnswer>,
    read: SpecReader,
    /// [`super::CDI_READ_DEADLINE`] but in tests.
    deadline: Duration,
    busy: bool,
    again: bool,
}

impl CdiCheck {
    /// Reads of `dirs`, answered on `tx`.
    pub(super) fn new(dirs: Vec<PathBuf>, tx: mpsc::Sender<CdiAnswer>) -> Self {
        CdiCheck {
            dirs,
            tx,
            read: Arc::new(crate::cdi::read_specs),
            deadline: super::CDI_READ_DEADLINE,
            busy: false,
            again: false,
        }
    }

    /// Starts a read, or queues one behind the read that runs.
    pub(super) fn start(&mut self) {
        if self.busy {
            self.again = true;
            return;
        }
        self.busy = true;
        let dirs = self.dirs.clone();
        let tx = self.tx.clone();
        let read = Arc::clone(&self.read);
        let deadline = self.deadline;
        tokio::spawn(async move {
            let d = dirs.clone();
            let mut reading = tokio::task::spawn_blocking(move || read(&d));
            let done = tokio::select! {
                done = &mut reading => done,
                () = tokio::time::sleep(deadline) => {
                    let _ = tx.send(CdiAnswer::Slow).await;
                    reading.await
                }
            };
            let index = done.unwrap_or_else(|e| {
                crate::cdi::unreadable(&dirs, format!("reading the CDI specs failed: {e}"))
            });
            let _ = tx.send(CdiAnswer::Done(index)).await;
        });
    }

    /// The read that ran has answered: starts the one queued behind it, if any.
    pub(super) fn answered(&mut self) {
        self.busy = false;
        if std::mem::take(&mut self.again) {
            self.start();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A read past [`super::super::CDI_READ_DEADLINE`] is reported slow once and then answered when it
    /// finishes; a request meanwhile starts no second read beside it (each timed-out read
    /// used to stay running while the next began: twelve 4 MiB specs took 757 MB).
    /// (Real time with a 1 ms deadline: tokio's paused clock does not advance while a blocking
    /// task runs. The order is fixed all the same: the read cannot end before it is released.)
    #[tokio::test]
    async fn a_slow_cdi_read_runs_alone_and_is_reported() {
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = std::sync::Mutex::new(release_rx);
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let (tx, mut rx) = mpsc::channel(2);
        let mut cdi = CdiCheck::new(vec![PathBuf::from("/nonexistent/cdi")], tx);
        cdi.deadline = Duration::from_millis(1);
        cdi.read = Arc::new(move |dirs: &[PathBuf]| {
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = release_rx.lock().unwrap().recv();
            crate::cdi::read_specs(dirs)
        });
        cdi.start();
        assert!(matches!(rx.recv().await, Some(CdiAnswer::Slow)));
        cdi.start();
        cdi.start();
        assert!(cdi.again, "a request while the read runs is queued");
        // `Slow` can come before the blocking thread has even started the read (a loaded
        // machine): at most one so far; exactly one once it is done (below).
        assert!(calls.load(Ordering::SeqCst) <= 1);
        release_tx.send(()).unwrap();
        match rx.recv().await {
            Some(CdiAnswer::Done(index)) => assert!(index.errors.is_empty(), "{index:?}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
