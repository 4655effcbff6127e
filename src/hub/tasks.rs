//! One task per member: spawned when a member joins the registry, cancelled when it
//! leaves, so a slow or partitioned member never blocks another.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::hub::members::Registry;

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
    for (_, (cancel, task)) in running {
        cancel.cancel();
        let _ = task.await;
    }
}
