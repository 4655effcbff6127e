//! One task per member: spawned when a member joins the registry, cancelled when it
//! leaves, so a slow or partitioned member never blocks another.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::hub::membership::members::Registry;

/// How long a member task may take to notice shutdown before it is aborted.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps one task per registered member running until `shutdown`, then waits for all.
/// `spawn` starts the task for a member name with its own cancellation token.
pub async fn per_member<F, Fut>(registry: Registry, shutdown: CancellationToken, spawn: F)
where
    F: Fn(String, CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut changes = registry.subscribe();
    let mut running: HashMap<String, (CancellationToken, JoinHandle<()>)> = HashMap::new();
    loop {
        let snapshot = registry.snapshot();
        running.retain(|name, (cancel, task)| {
            let keep = snapshot.contains_key(name) && !task.is_finished();
            if !keep {
                cancel.cancel();
            }
            keep
        });
        for name in snapshot.keys() {
            if !running.contains_key(name) {
                let cancel = shutdown.child_token();
                let task = tokio::spawn(spawn(name.clone(), cancel.clone()));
                running.insert(name.clone(), (cancel, task));
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = changes.changed() => if changed.is_err() { break },
        }
    }
    for (cancel, _) in running.values() {
        cancel.cancel();
    }
    // A task stops at its next await of the token; one stuck in a request gets a short
    // grace and is then aborted, so SIGTERM never waits for a member's timeout.
    for (name, (_, task)) in running {
        let abort = task.abort_handle();
        if tokio::time::timeout(SHUTDOWN_GRACE, task).await.is_err() {
            tracing::debug!(member = %name, "task did not stop in time; aborting it");
            abort.abort();
        }
    }
}
