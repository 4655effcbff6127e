//! A keyed work queue (the shape of client-go's workqueue): a key waits at most once, a
//! key being worked on is never handed to a second worker, a key added while it is being
//! worked on is worked on again afterwards, and a key can be scheduled for later.
//!
//! The federation controller keeps one queue of templates; every member writer keeps one
//! of copies. Deduplication is what makes a burst cheap: a template touched by ten events
//! while it waits is reconciled once.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

struct State<K> {
    ready: VecDeque<K>,
    queued: HashSet<K>,
    active: HashSet<K>,
    /// Added while active: queued again when its worker is done.
    dirty: HashSet<K>,
    /// Scheduled for later, by due time (the sequence number keeps equal times apart).
    delayed: BTreeMap<(Instant, u64), K>,
    due: HashMap<K, (Instant, u64)>,
    sequence: u64,
    /// A key taken by a worker loses its schedule (see [`WorkQueue::rescheduled_by_work`]).
    taking_forgets_schedule: bool,
}

impl<K: Clone + Eq + Hash> State<K> {
    fn add(&mut self, key: K) -> bool {
        if self.queued.contains(&key) {
            return false;
        }
        if self.active.contains(&key) {
            self.dirty.insert(key);
            return false;
        }
        self.queued.insert(key.clone());
        self.ready.push_back(key);
        true
    }

    /// Moves every delayed key that is due into the ready list; returns how many.
    fn promote(&mut self, now: Instant) -> usize {
        let mut promoted = 0;
        while let Some((&(at, sequence), _)) = self.delayed.iter().next() {
            if at > now {
                break;
            }
            let key = self.delayed.remove(&(at, sequence)).expect("present");
            self.due.remove(&key);
            if self.add(key) {
                promoted += 1;
            }
        }
        promoted
    }

    fn next_due(&self) -> Option<Instant> {
        self.delayed.keys().next().map(|(at, _)| *at)
    }
}

/// See the module documentation. Cheap to clone; clones share the queue.
pub struct WorkQueue<K> {
    state: Arc<Mutex<State<K>>>,
    notify: Arc<Notify>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            state: self.state.clone(),
            notify: self.notify.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash> Default for WorkQueue<K> {
    fn default() -> Self {
        WorkQueue {
            state: Arc::new(Mutex::new(State {
                ready: VecDeque::new(),
                queued: HashSet::new(),
                active: HashSet::new(),
                dirty: HashSet::new(),
                delayed: BTreeMap::new(),
                due: HashMap::new(),
                sequence: 0,
                taking_forgets_schedule: false,
            })),
            notify: Arc::new(Notify::new()),
        }
    }
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    /// A queue whose work says when a key is needed again: taking a key for work forgets
    /// its schedule for later (the work sees everything that schedule was for, and
    /// schedules the key again when it needs to). So a key scheduled for progress that
    /// can wait ([`add_after`]) and worked on sooner for another reason is not worked on
    /// a second time. kube-runtime's controller keeps one schedule per object the same way.
    ///
    /// [`add_after`]: WorkQueue::add_after
    pub fn rescheduled_by_work() -> Self {
        let queue = Self::default();
        queue.lock().taking_forgets_schedule = true;
        queue
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key` now (no-op when it already waits).
    pub fn add(&self, key: K) {
        if self.lock().add(key) {
            self.notify.notify_one();
        }
    }

    /// Queues `key` after `delay`; an earlier schedule of the same key wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let at = Instant::now() + delay;
        let mut state = self.lock();
        if let Some(&(existing, _)) = state.due.get(&key) {
            if existing <= at {
                return;
            }
            let old = state.due.remove(&key).expect("present");
            state.delayed.remove(&old);
        }
        state.sequence += 1;
        let slot = (at, state.sequence);
        state.delayed.insert(slot, key.clone());
        state.due.insert(key, slot);
        drop(state);
        // A sleeping worker may be waiting for a later time.
        self.notify.notify_waiters();
    }

    /// The next key to work on, or None on shutdown. The caller must call [`done`]
    /// with it when finished.
    ///
    /// [`done`]: WorkQueue::done
    pub async fn next(&self, shutdown: &CancellationToken) -> Option<K> {
        loop {
            // Registered before looking, so an add between the look and the wait is not
            // missed.
            let notified = self.notify.notified();
            let wait = {
                let mut state = self.lock();
                state.promote(Instant::now());
                if let Some(key) = state.ready.pop_front() {
                    state.queued.remove(&key);
                    if state.taking_forgets_schedule
                        && let Some(slot) = state.due.remove(&key)
                    {
                        state.delayed.remove(&slot);
                    }
                    state.active.insert(key.clone());
                    let more = !state.ready.is_empty();
                    drop(state);
                    if more {
                        // Hand the rest to another worker.
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
                state
                    .next_due()
                    .map(|at| at.saturating_duration_since(Instant::now()))
            };
            let sleep = tokio::time::sleep(wait.unwrap_or(Duration::from_secs(3600)));
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = notified => {}
                _ = sleep => {}
            }
        }
    }

    /// Marks `key` finished; it is queued again if it was added meanwhile.
    pub fn done(&self, key: &K) {
        let mut state = self.lock();
        state.active.remove(key);
        if state.dirty.remove(key) && state.add(key.clone()) {
            drop(state);
            self.notify.notify_one();
        }
    }

    /// Keys waiting now (not counting delayed or active ones).
    pub fn len(&self) -> usize {
        self.lock().ready.len()
    }

    /// No key waits now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys scheduled for later.
    pub fn delayed(&self) -> usize {
        self.lock().delayed.len()
    }

    /// Keys being worked on.
    pub fn active(&self) -> usize {
        self.lock().active.len()
    }

    /// Forgets a delayed schedule of `key` (it is no longer wanted).
    pub fn cancel_delayed(&self, key: &K) {
        let mut state = self.lock();
        if let Some(slot) = state.due.remove(key) {
            state.delayed.remove(&slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> CancellationToken {
        CancellationToken::new()
    }

    #[tokio::test]
    async fn a_key_waits_once_however_often_it_is_added() {
        let queue = WorkQueue::default();
        queue.add("a");
        queue.add("b");
        queue.add("a");
        assert_eq!(queue.len(), 2);
        let shutdown = token();
        assert_eq!(queue.next(&shutdown).await, Some("a"));
        assert_eq!(queue.next(&shutdown).await, Some("b"));
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn a_key_added_while_active_comes_back_after_done() {
        let queue = WorkQueue::default();
        let shutdown = token();
        queue.add("a");
        let key = queue.next(&shutdown).await.unwrap();
        queue.add("a");
        // Not handed out twice at once.
        assert!(queue.is_empty());
        queue.done(&key);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.next(&shutdown).await, Some("a"));
        queue.done(&"a");
        assert!(queue.is_empty());
        assert_eq!(queue.active(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_come_when_due_and_the_earlier_schedule_wins() {
        let queue = WorkQueue::default();
        let shutdown = token();
        queue.add_after("late", Duration::from_secs(10));
        queue.add_after("late", Duration::from_secs(30));
        queue.add_after("soon", Duration::from_secs(1));
        let started = tokio::time::Instant::now();
        assert_eq!(queue.next(&shutdown).await, Some("soon"));
        assert!(started.elapsed() >= Duration::from_secs(1));
        assert_eq!(queue.next(&shutdown).await, Some("late"));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(10) && waited < Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_schedule_never_comes() {
        let queue = WorkQueue::default();
        queue.add_after("gone", Duration::from_secs(1));
        queue.cancel_delayed(&"gone");
        let shutdown = token();
        let waiting = tokio::time::timeout(Duration::from_secs(5), queue.next(&shutdown)).await;
        assert!(waiting.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_taken_early_loses_its_schedule_when_work_reschedules() {
        let shutdown = token();
        for (queue, comes_again) in [
            (WorkQueue::rescheduled_by_work(), false),
            (WorkQueue::default(), true),
        ] {
            queue.add_after("a", Duration::from_secs(5));
            queue.add("a");
            assert_eq!(queue.next(&shutdown).await, Some("a"));
            queue.done(&"a");
            let again = tokio::time::timeout(Duration::from_secs(10), queue.next(&shutdown)).await;
            assert_eq!(again.ok().flatten().is_some(), comes_again);
            assert_eq!(queue.delayed(), 0);
        }
    }

    #[tokio::test]
    async fn an_add_wakes_a_waiting_worker_and_shutdown_ends_it() {
        let queue = WorkQueue::default();
        let shutdown = token();
        let worker = {
            let queue = queue.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { queue.next(&shutdown).await })
        };
        tokio::task::yield_now().await;
        queue.add(7);
        assert_eq!(worker.await.unwrap(), Some(7));
        let idle = {
            let queue = queue.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { queue.next(&shutdown).await })
        };
        shutdown.cancel();
        assert_eq!(idle.await.unwrap(), None);
    }

    #[tokio::test]
    async fn many_workers_share_the_keys_without_duplicates() {
        let queue = WorkQueue::default();
        let shutdown = token();
        for key in 0..200 {
            queue.add(key);
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let queue = queue.clone();
                let shutdown = shutdown.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    while let Ok(Some(key)) =
                        tokio::time::timeout(Duration::from_millis(50), queue.next(&shutdown)).await
                    {
                        seen.lock().unwrap().push(key);
                        queue.done(&key);
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.unwrap();
        }
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..200).collect::<Vec<_>>());
    }
}
