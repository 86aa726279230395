//! One read at a time, off the loop: the policy and MIG-layout sources each keep a
//! [`ReadQueue`] (never two reads of one file at once; a request while one runs waits for it),
//! and run each read on a blocking thread within a deadline ([`blocking_within`]).

use std::time::Duration;

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

/// Runs `work` on a blocking thread within `deadline`; the error says what went wrong in words
/// that follow `what` ("reading the CDI specs failed: …", "reading the CDI specs took longer
/// than 5s"). The thread is not waited for past the deadline (a hung file system keeps it, never
/// the loop).
pub(super) async fn blocking_within<T: Send + 'static>(
    what: &str,
    deadline: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlockingError> {
    match tokio::time::timeout(deadline, tokio::task::spawn_blocking(work)).await {
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
}

impl<W, T: Send + 'static> ReadQueue<W, T> {
    /// Nothing running, nothing queued.
    pub(super) fn new() -> Self {
        ReadQueue {
            running: None,
            queued: None,
        }
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
