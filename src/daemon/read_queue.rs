//! One read at a time, off the loop: the policy and MIG-layout sources each keep a
//! [`ReadQueue`] (never two reads of one file at once; a request while one runs waits for it),
//! and run each read on a blocking thread within a deadline ([`ReadQueue::blocking`]). A read
//! past its deadline is answered [`BlockingError::Slow`] and its thread left to finish, but
//! the queue's gate stays with that thread: the next read waits for it (within its own
//! deadline) instead of starting a second thread on the same hung file system.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::{JoinError, JoinHandle};

/// Why work run by [`blocking_within`] gave no value.
#[derive(Debug, thiserror::Error)]
pub enum BlockingError {
    /// The blocking task panicked or was cancelled.
    #[error("{what} failed: {source}")]
    Failed {
        /// What the work does ("reading /etc/slicelet/config.yaml").
        what: String,
        /// The task's error.
        #[source]
        source: JoinError,
    },
    /// The deadline passed first (the thread is left to finish on its own).
    #[error("{what} took longer than {deadline:?}")]
    Slow {
        /// What the work does.
        what: String,
        /// The deadline.
        deadline: Duration,
    },
}

/// Runs `work` on a blocking thread, holding `gate` (one permit) from before the thread starts
/// until it ends, all within `deadline`; the error says what went wrong in words that follow
/// `what` ("reading /etc/slicelet/config.yaml failed: …", "… took longer than 5s"). The thread
/// is not waited for past the deadline (a hung file system keeps it, never the loop), and no
/// thread starts while an earlier one holds the gate.
async fn blocking_within<T: Send + 'static>(
    what: &str,
    deadline: Duration,
    gate: Arc<Semaphore>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlockingError> {
    let run = async move {
        // Never closed: the queue owns the semaphore and closes nothing.
        let permit = gate.acquire_owned().await.ok();
        tokio::task::spawn_blocking(move || {
            let _held = permit;
            work()
        })
        .await
    };
    match tokio::time::timeout(deadline, run).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(BlockingError::Failed {
            what: what.to_string(),
            source,
        }),
        Err(_) => Err(BlockingError::Slow {
            what: what.to_string(),
            deadline,
        }),
    }
}

/// The running read of one source and the request queued behind it. `W` is what a request
/// carries (the policy's `force`; nothing for the MIG layouts), `T` what a read answers (the
/// fold's input); two requests queued while a read runs merge into one.
pub(super) struct ReadQueue<W, T> {
    running: Option<JoinHandle<T>>,
    queued: Option<W>,
    /// Held by a read's blocking thread from before it starts until it ends.
    gate: Arc<Semaphore>,
}

impl<W, T: Send + 'static> ReadQueue<W, T> {
    /// Nothing running, nothing queued.
    pub(super) fn new() -> Self {
        ReadQueue {
            running: None,
            queued: None,
            gate: Arc::new(Semaphore::new(1)),
        }
    }

    /// `work` on a blocking thread within `deadline`, through this queue's gate (module doc):
    /// to await at once (the first read) or to pass to [`ReadQueue::start`].
    ///
    /// # Errors
    /// [`BlockingError`]: the work panicked, or the deadline passed (waiting for an earlier
    /// read's thread counts).
    pub(super) fn blocking<R: Send + 'static>(
        &self,
        what: &str,
        deadline: Duration,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> impl std::future::Future<Output = Result<R, BlockingError>> + Send + 'static {
        let gate = self.gate.clone();
        let what = what.to_string();
        async move { blocking_within(&what, deadline, gate, work).await }
    }

    /// Queues a request: `merge` gets the one already queued, if any, and returns the one to
    /// keep.
    pub(super) fn want(&mut self, merge: impl FnOnce(Option<W>) -> W) {
        self.queued = Some(merge(self.queued.take()));
    }

    /// The queued request, taken, when no read runs (`None` while one runs or none is queued).
    pub(super) fn next(&mut self) -> Option<W> {
        if self.running.is_some() {
            return None;
        }
        self.queued.take()
    }

    /// Spawns `read` as the running read (after [`ReadQueue::next`] gave a request).
    pub(super) fn start(&mut self, read: impl std::future::Future<Output = T> + Send + 'static) {
        debug_assert!(self.running.is_none(), "one read at a time");
        self.running = Some(tokio::spawn(read));
    }

    /// Whether a read runs.
    pub(super) fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// The running read's answer (pending while none runs); a read whose task panicked or was
    /// cancelled is answered by `lost`.
    pub(super) async fn done(&mut self, lost: impl FnOnce(JoinError) -> T) -> T {
        let Some(running) = self.running.as_mut() else {
            return std::future::pending().await;
        };
        let done = running.await;
        self.running = None;
        done.unwrap_or_else(lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request while a read runs waits for it; requests queued meanwhile merge into one.
    #[tokio::test]
    async fn one_read_runs_at_a_time_and_queued_requests_merge() {
        let mut q: ReadQueue<bool, u32> = ReadQueue::new();
        assert_eq!(q.next(), None, "nothing queued");
        q.want(|old| old.unwrap_or(false));
        assert_eq!(q.next(), Some(false));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        q.start(async move {
            let _ = rx.await;
            7
        });
        q.want(|old| old.unwrap_or(false));
        q.want(|_| true);
        q.want(|old| old.unwrap_or(false));
        assert!(q.is_running());
        assert_eq!(q.next(), None, "no second read while one runs");
        tx.send(()).unwrap();
        assert_eq!(q.done(|_| panic!("lost")).await, 7);
        assert!(!q.is_running());
        assert_eq!(
            q.next(),
            Some(true),
            "the three requests merged, the forced one won"
        );
        assert_eq!(q.next(), None);
    }

    /// A read past its deadline is answered Slow and keeps its thread; the next read waits for
    /// that thread instead of starting a second one beside it, and runs once it ended.
    #[tokio::test]
    async fn a_read_past_its_deadline_keeps_the_next_from_starting_a_second_thread() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let q: ReadQueue<(), u32> = ReadQueue::new();
        let short = Duration::from_millis(20);
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let first = q.blocking("reading a", short, move || {
            let _ = hung.recv();
            1
        });
        let slow = first.await.unwrap_err();
        assert!(matches!(slow, BlockingError::Slow { .. }), "{slow}");
        assert_eq!(slow.to_string(), "reading a took longer than 20ms");
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let second = q.blocking("reading a", short, move || {
            r.store(true, Ordering::SeqCst);
            2
        });
        assert!(matches!(second.await, Err(BlockingError::Slow { .. })));
        release.send(()).unwrap();
        let third = q.blocking("reading a", Duration::from_secs(20), || 3);
        assert_eq!(third.await.unwrap(), 3);
        assert!(
            !ran.load(Ordering::SeqCst),
            "the second read never started a thread beside the hung one"
        );
    }

    /// A read that panics is answered by `lost`, and the queue takes the next request.
    #[tokio::test]
    async fn a_panicking_read_is_answered_by_lost() {
        let mut q: ReadQueue<(), u32> = ReadQueue::new();
        q.want(|_| ());
        q.next().unwrap();
        q.start(async { panic!("read panicked") });
        let got = q.done(|e| {
            assert!(e.is_panic());
            0
        });
        assert_eq!(got.await, 0);
        assert!(!q.is_running());
        q.want(|_| ());
        assert_eq!(q.next(), Some(()), "the next read may start");
    }
}
