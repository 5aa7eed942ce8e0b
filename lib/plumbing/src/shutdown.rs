//! Shutdown on SIGTERM or SIGINT, as every binary's `main` needs it.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// Resolves when the process receives SIGTERM or SIGINT.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; shutting down");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received, draining"),
        _ = int.recv() => tracing::info!("SIGINT received, draining"),
    }
}

/// A shutdown trigger that many tasks can wait on; `run(config, shutdown)` functions take one.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

/// The sending half of [`Shutdown`].
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

/// A new trigger and the shutdown it fires.
pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger(tx), Shutdown(rx))
}

impl Trigger {
    /// Starts the shutdown of everything holding the matching [`Shutdown`].
    pub fn fire(&self) {
        let _ = self.0.send(true);
    }
}

impl Shutdown {
    /// A shutdown that fires when the process is signalled.
    pub fn on_signal() -> Shutdown {
        let (trigger, shutdown) = channel();
        tokio::spawn(async move {
            signal().await;
            trigger.fire();
        });
        shutdown
    }

    /// Resolves once shutdown has been requested (or every trigger is gone).
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|fired| *fired).await;
    }

    /// Whether shutdown has been requested.
    pub fn is_fired(&self) -> bool {
        *self.0.borrow()
    }
}

/// Runs `serve`, a server future that stops accepting when `shutdown` fires and then finishes
/// its in-flight requests; if those take longer than `grace` after the shutdown, gives up on them
/// and returns `Ok(())`, so the process exits before the pod's termination grace period ends and
/// the kubelet's SIGKILL.
pub async fn drain<E>(
    serve: impl Future<Output = Result<(), E>>,
    shutdown: Shutdown,
    grace: Duration,
) -> Result<(), E> {
    tokio::select! {
        served = serve => served,
        () = async { shutdown.wait().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(?grace, "drain timeout passed; dropping open connections");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_the_server_then_gives_up_after_the_grace() {
        // A server that finishes its last request 5 s after the shutdown: within a 10 s grace.
        let (trigger, shutdown) = channel();
        let server = {
            let shutdown = shutdown.clone();
            async move {
                shutdown.wait().await;
                tokio::time::sleep(Duration::from_secs(5)).await;
                Err::<(), &str>("finished")
            }
        };
        trigger.fire();
        let started = tokio::time::Instant::now();
        assert_eq!(
            drain(server, shutdown, Duration::from_secs(10)).await,
            Err("finished")
        );
        assert_eq!(started.elapsed(), Duration::from_secs(5));

        // A server that never finishes: dropped when the grace is over.
        let (trigger, shutdown) = channel();
        trigger.fire();
        let started = tokio::time::Instant::now();
        let stuck = std::future::pending::<Result<(), &str>>();
        assert_eq!(
            drain(stuck, shutdown, Duration::from_secs(10)).await,
            Ok(())
        );
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }
}
