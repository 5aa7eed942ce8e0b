//! Shutdown on SIGTERM or SIGINT, as every binary's `main` needs it.

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
