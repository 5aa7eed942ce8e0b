//! A bounded pool of threads for attestation checks.
//!
//! Verifying a document means signature checks and hashing over up to tens of kilobytes: CPU
//! work that must not run on the async runtime's threads, where it would stall every other
//! handshake. The queue in front of the threads is bounded, so a flood of documents is refused
//! at once instead of piling up in memory.

use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send>;

/// Why a job did not run.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Every thread is busy and the queue is full.
    #[error("attestation verification queue is full ({queue} waiting)")]
    Overloaded { queue: usize },
    /// The pool's threads are gone (the process is shutting down) or the job panicked.
    #[error("attestation verification pool is unavailable")]
    Gone,
}

/// Fixed threads behind a bounded queue.
#[derive(Clone, Debug)]
pub struct VerifyPool {
    sender: SyncSender<Job>,
    queue: usize,
}

impl VerifyPool {
    /// Starts `threads` worker threads with room for `queue` waiting jobs.
    pub fn new(threads: usize, queue: usize) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::sync_channel::<Job>(queue);
        let receiver = Arc::new(Mutex::new(receiver));
        for n in 0..threads.max(1) {
            let receiver = receiver.clone();
            std::thread::Builder::new()
                .name(format!("verify-{n}"))
                .spawn(move || {
                    loop {
                        // Hold the lock only to take one job, never while running it.
                        let job = match receiver.lock() {
                            Ok(receiver) => receiver.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                })?;
        }
        Ok(Self { sender, queue })
    }

    /// Runs `f` on a pool thread, or refuses at once if the queue is full.
    pub async fn run<T, F>(&self, f: F) -> Result<T, PoolError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            // The caller gave up (its handshake timed out): skip the work, so a flood of
            // abandoned connections does not keep the threads busy after they are gone.
            if tx.is_closed() {
                return;
            }
            let _ = tx.send(f());
        });
        match self.sender.try_send(job) {
            Ok(()) => rx.await.map_err(|_| PoolError::Gone),
            Err(TrySendError::Full(_)) => Err(PoolError::Overloaded { queue: self.queue }),
            Err(TrySendError::Disconnected(_)) => Err(PoolError::Gone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[tokio::test]
    async fn runs_jobs_off_the_runtime() {
        let pool = VerifyPool::new(2, 4).unwrap();
        let name = pool
            .run(|| std::thread::current().name().map(str::to_owned))
            .await
            .unwrap();
        assert!(name.unwrap().starts_with("verify-"));
    }

    #[tokio::test]
    async fn skips_jobs_whose_caller_gave_up() {
        let pool = VerifyPool::new(1, 4).unwrap();
        let gate = Arc::new(Barrier::new(2));
        let blocker = {
            let (pool, gate) = (pool.clone(), gate.clone());
            tokio::spawn(async move { pool.run(move || gate.wait()).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let abandoned = {
            let ran = ran.clone();
            pool.run(move || ran.store(true, std::sync::atomic::Ordering::SeqCst))
        };
        // Queued, then given up on before a thread is free.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), abandoned)
                .await
                .is_err()
        );
        gate.wait();
        blocker.await.unwrap().unwrap();
        assert_eq!(pool.run(|| 9).await.unwrap(), 9);
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test]
    async fn refuses_when_full() {
        let pool = VerifyPool::new(1, 1).unwrap();
        let gate = Arc::new(Barrier::new(2));
        // One job occupies the thread, one waits in the queue; the third must be refused.
        let blocker = {
            let (pool, gate) = (pool.clone(), gate.clone());
            tokio::spawn(async move { pool.run(move || gate.wait()).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let queued = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.run(|| 7).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(matches!(
            pool.run(|| 8).await,
            Err(PoolError::Overloaded { queue: 1 })
        ));
        gate.wait();
        blocker.await.unwrap().unwrap();
        assert_eq!(queued.await.unwrap().unwrap(), 7);
    }
}
