//! The `Selected` condition of every PropagationPolicy and ClusterPropagationPolicy: how
//! many templates the policy selects and places, or, when it selects nothing, why not
//! (per selector: a kind the hub does not federate, no template of the kind in the
//! namespace the selector reaches, none with that name, pattern or labels).
//!
//! Computed per policy from the hub's stores, not per template event: [`tally`] is a pure
//! function over the policies and an iterator of templates (whatever kinds the hub
//! watches), and [`run`] recomputes it a moment after the hub's watches report changes
//! ([`COALESCE`]: a burst of events is one computation), writing a policy's status only
//! when its content changed and at most once per [`MIN_INTERVAL`] per policy. It runs
//! inside the federation controller, so only on the leader, through the controller's
//! leadership-gated client. [`Selection::pending`] counts in the hub's queue-depth gauge
//! while a computation or a deferred write is due, so "settled" includes it.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::api::propagation_policy::{PropagationPolicyStatus, ResourceSelector};
use crate::api::{
    ClusterPropagationPolicy, ConditionStatus, PropagationPolicy, find_condition, new_condition,
    set_condition,
};
use crate::hub::federation::context::Context;
use crate::hub::federation::matching::{
    PolicyCandidate, PolicyScope, SelectorStrength, TemplateRef, compare, describe_selector,
    is_pattern, selector_in_scope, selector_strength,
};
use crate::hub::federation::scheduler::is_excluded_namespace;

/// The condition type.
pub const CONDITION: &str = "Selected";
/// Field manager of the hub's policy status writes.
pub const FIELD_MANAGER: &str = "bulkhead-hub-policy-status";
/// How long after a change the hub waits before recomputing, so a burst of template
/// events is one computation (a few per second at most, each a pass over the stores).
pub const COALESCE: Duration = Duration::from_millis(250);
/// The fewest seconds between two status writes of one policy.
pub const MIN_INTERVAL: Duration = Duration::from_secs(5);
/// Recomputed this often even without any change (a write that failed, a store that was
/// not ready).
const RESYNC: Duration = Duration::from_secs(60);
/// How long the writes owed at shutdown may take.
const FLUSH: Duration = Duration::from_secs(1);
/// Policies named in a message, at most.
const NAMED: usize = 3;

/// What one selector of a policy reaches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SelectorTally {
    /// Templates of the selector's apiVersion and kind in the namespaces it reaches.
    pub in_scope: usize,
    /// Of those, the ones its name, pattern or labels match.
    pub matched: usize,
}

/// What one policy selects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Templates any of its selectors match.
    pub selected: usize,
    /// Of those, the templates it places (it wins the precedence).
    pub placed: usize,
    /// The policies that win the others, by description, with how many each.
    pub lost_to: BTreeMap<String, usize>,
    /// One entry per resource selector.
    pub selectors: Vec<SelectorTally>,
}

/// Counts, for every candidate (in order), what it selects among `templates` and how many
/// of those it wins. Templates in namespaces that are never federated (bulkhead-system,
/// kube-*) are skipped.
pub fn tally<'t>(
    candidates: &[PolicyCandidate],
    templates: impl IntoIterator<Item = TemplateRef<'t>>,
) -> Vec<Tally> {
    let mut tallies: Vec<Tally> = candidates
        .iter()
        .map(|p| Tally {
            selectors: vec![SelectorTally::default(); p.spec.resource_selectors.len()],
            ..Tally::default()
        })
        .collect();
    let mut selecting: Vec<(usize, SelectorStrength)> = Vec::new();
    for template in templates {
        if is_excluded_namespace(template.namespace) {
            continue;
        }
        selecting.clear();
        for (index, policy) in candidates.iter().enumerate() {
            let mut best: Option<SelectorStrength> = None;
            for (s, selector) in policy.spec.resource_selectors.iter().enumerate() {
                if !selector_in_scope(selector, &template, policy.scope, policy.namespace) {
                    continue;
                }
                tallies[index].selectors[s].in_scope += 1;
                if let Some(strength) =
                    selector_strength(selector, &template, policy.scope, policy.namespace)
                {
                    tallies[index].selectors[s].matched += 1;
                    best = best.max(Some(strength));
                }
            }
            if let Some(strength) = best {
                tallies[index].selected += 1;
                selecting.push((index, strength));
            }
        }
        let Some(&(winner, winner_strength)) = selecting
            .iter()
            .min_by(|a, b| compare((&candidates[a.0], a.1), (&candidates[b.0], b.1)))
        else {
            continue;
        };
        tallies[winner].placed += 1;
        let winner_name = candidates[winner].describe();
        for &(index, _) in &selecting {
            if index != winner {
                *tallies[index]
                    .lost_to
                    .entry(format!("{winner_name} ({})", winner_strength.words()))
                    .or_default() += 1;
            }
        }
    }
    tallies
}

fn templates_word(count: usize) -> &'static str {
    if count == 1 { "template" } else { "templates" }
}

/// The kinds the hub federates, and the ones it was asked to but cannot (with why).
pub struct KindSet<'a> {
    /// The (apiVersion, kind) pairs the hub watches as templates.
    pub federated: &'a [(&'a str, &'a str)],
    /// The kinds the policies select (or workloads reference) that discovery refused.
    pub refused: &'a [crate::hub::federation::discovery::Refusal],
}

/// The `Selected` condition for `policy` from its tally: (status, reason, message).
pub fn condition(
    policy: &PolicyCandidate,
    tally: &Tally,
    federated: &KindSet<'_>,
) -> (ConditionStatus, &'static str, String) {
    if tally.selected > 0 {
        let selects = format!(
            "selects {} {}",
            tally.selected,
            templates_word(tally.selected)
        );
        if tally.placed == tally.selected {
            let all = if tally.selected == 1 {
                "it"
            } else {
                "all of them"
            };
            return (
                ConditionStatus::True,
                "TemplatesSelected",
                format!("{selects} and places {all}"),
            );
        }
        let lost = tally.selected - tally.placed;
        let mut winners: Vec<(&String, &usize)> = tally.lost_to.iter().collect();
        winners.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let mut named: Vec<String> = winners
            .iter()
            .take(NAMED)
            .map(|(who, count)| format!("{count} to {who}"))
            .collect();
        if winners.len() > NAMED {
            named.push(format!("{} more policies", winners.len() - NAMED));
        }
        let reason = if tally.placed == 0 {
            "Outranked"
        } else {
            "PartlyOutranked"
        };
        return (
            ConditionStatus::True,
            reason,
            format!(
                "{selects} and places {}; {lost} {} to policies of higher precedence (priority, then selector strength, then scope, then name): {}",
                tally.placed,
                if lost == 1 {
                    "template goes"
                } else {
                    "templates go"
                },
                named.join(", ")
            ),
        );
    }
    let hints: Vec<String> = policy
        .spec
        .resource_selectors
        .iter()
        .zip(&tally.selectors)
        .enumerate()
        .map(|(index, (selector, counts))| {
            format!(
                "resourceSelectors[{index}] ({}): {}",
                describe_kind(selector),
                selector_hint(policy, selector, counts, federated)
            )
        })
        .collect();
    (
        ConditionStatus::False,
        "NothingSelected",
        format!("no template matches: {}", hints.join("; ")),
    )
}

fn describe_kind(selector: &ResourceSelector) -> String {
    format!("{} {}", selector.api_version, selector.kind)
}

/// Why one selector matches nothing, with a hint.
fn selector_hint(
    policy: &PolicyCandidate,
    selector: &ResourceSelector,
    counts: &SelectorTally,
    federated: &KindSet<'_>,
) -> String {
    let kind = &selector.kind;
    if let Some(refusal) = federated
        .refused
        .iter()
        .find(|r| r.kind.api_version == selector.api_version && &r.kind.kind == kind)
    {
        return format!(
            "{} {kind} cannot be federated: {}",
            selector.api_version, refusal.reason
        );
    }
    let federated = federated.federated;
    if !federated
        .iter()
        .any(|(api_version, k)| *api_version == selector.api_version && k == kind)
    {
        let same_kind: Vec<&str> = federated
            .iter()
            .filter(|(_, k)| k.eq_ignore_ascii_case(kind))
            .map(|(api_version, _)| *api_version)
            .collect();
        let mut hint = format!(
            "{} {kind} is not a kind the hub federates",
            selector.api_version
        );
        if let Some(api_version) = same_kind.first() {
            hint.push_str(&format!(
                "; did you mean apiVersion {api_version}, kind {}?",
                federated
                    .iter()
                    .find(|(a, k)| a == api_version && k.eq_ignore_ascii_case(kind))
                    .map_or(kind.as_str(), |(_, k)| *k)
            ));
        } else {
            let mut known: Vec<String> =
                federated.iter().map(|(a, k)| format!("{a} {k}")).collect();
            known.sort();
            hint.push_str(&format!(" (it federates {})", known.join(", ")));
        }
        return hint;
    }
    let (where_, namespace) = match policy.scope {
        PolicyScope::Namespaced => {
            let ns = policy.namespace.unwrap_or_default();
            (format!("in namespace {ns}"), Some(ns))
        }
        PolicyScope::Cluster => match selector.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => (format!("in namespace {ns}"), Some(ns)),
            None => ("in any namespace".to_string(), None),
        },
    };
    if let Some(ns) = namespace
        && is_excluded_namespace(ns)
    {
        return format!(
            "namespace {ns} is never federated (bulkhead-system and kube-* hold the system and the members' credentials, and the hub's --exclude-namespace list names the others); put the templates in another namespace"
        );
    }
    if counts.in_scope == 0 {
        let hint = match policy.scope {
            PolicyScope::Namespaced if selector.namespace.is_some() => {
                " (a PropagationPolicy selects only in its own namespace and ignores the selector's namespace; use a ClusterPropagationPolicy to select in another)"
            }
            PolicyScope::Namespaced => {
                " (a PropagationPolicy selects only in its own namespace; use a ClusterPropagationPolicy to select in others)"
            }
            PolicyScope::Cluster if namespace.is_some() => {
                " (the selector's namespace must be the templates' namespace; leave it empty to select in every namespace)"
            }
            PolicyScope::Cluster => "",
        };
        return format!("no {kind} {where_} yet{hint}");
    }
    let there = format!(
        "{} {kind} {} {where_}, but",
        counts.in_scope,
        templates_word(counts.in_scope)
    );
    match (&selector.name, &selector.label_selector) {
        (Some(name), _) if is_pattern(name) => format!(
            "{there} none matches the name pattern {name} (* matches any run of characters, ? one character)"
        ),
        (Some(name), _) => format!(
            "{there} none is named {name} (an exact name; use a pattern such as {name}* to select several)"
        ),
        (None, Some(_)) => format!("{there} none has the {}", describe_selector(selector)),
        (None, None) => format!("{there} none matches"),
    }
}

/// A policy's desired status, keeping `lastTransitionTime` from `current` while the
/// condition's status stays the same.
pub fn desired_status(
    policy: &PolicyCandidate,
    generation: Option<i64>,
    tally: &Tally,
    federated: &KindSet<'_>,
    current: Option<&PropagationPolicyStatus>,
) -> PropagationPolicyStatus {
    let (status, reason, message) = condition(policy, tally, federated);
    let mut conditions = current.map(|s| s.conditions.clone()).unwrap_or_default();
    set_condition(
        &mut conditions,
        new_condition(CONDITION, status, reason, message, generation),
    );
    PropagationPolicyStatus {
        observed_generation: generation,
        selected_templates: tally.selected as i64,
        placed_templates: tally.placed as i64,
        conditions,
    }
}

/// Whether two statuses say the same (everything but the conditions' transition times).
pub fn same_content(a: &PropagationPolicyStatus, b: &PropagationPolicyStatus) -> bool {
    let condition = |s: &PropagationPolicyStatus| {
        find_condition(&s.conditions, CONDITION).map(|c| {
            (
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
                c.observed_generation,
            )
        })
    };
    a.observed_generation == b.observed_generation
        && a.selected_templates == b.selected_templates
        && a.placed_templates == b.placed_templates
        && condition(a) == condition(b)
}

/// Wraps the trigger of a policy watch: an update that changed only the policy's status
/// (the hub's own write) or its resourceVersion triggers nothing.
pub(super) fn spec_changes<K, F>(
    mut to_trigger: F,
) -> impl FnMut(watcher::Event<K>) -> super::Trigger
where
    K: Resource + serde::Serialize,
    F: FnMut(watcher::Event<K>) -> super::Trigger,
{
    let mut seen: HashMap<(Option<String>, String), u64> = HashMap::new();
    move |event| {
        match &event {
            watcher::Event::Apply(object) => {
                let print = fingerprint(object);
                if seen.insert(policy_key(object), print) == Some(print) {
                    return super::Trigger::Nothing;
                }
            }
            watcher::Event::InitApply(object) => {
                seen.insert(policy_key(object), fingerprint(object));
            }
            watcher::Event::Delete(object) => {
                seen.remove(&policy_key(object));
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
        to_trigger(event)
    }
}

fn policy_key<K: Resource>(object: &K) -> (Option<String>, String) {
    (
        object.meta().namespace.clone(),
        object.meta().name.clone().unwrap_or_default(),
    )
}

/// Everything of a policy but its status and the metadata the API server changes on
/// every write.
fn fingerprint<K: serde::Serialize>(object: &K) -> u64 {
    super::fingerprint(object, None)
}

/// One policy as the writer tracks it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct PolicyKey {
    scope_cluster: bool,
    namespace: Option<String>,
    name: String,
    uid: Option<String>,
}

/// The last status the hub wrote for a policy, and when.
struct Written {
    status: PropagationPolicyStatus,
    at: Instant,
}

/// The controller's handle on the policy status task.
#[derive(Default)]
pub(super) struct Selection {
    changes: Notify,
    /// A change arrived that no computation has seen yet.
    dirty: AtomicBool,
    /// Policies whose new status waits for its write (rate limit, or a failed write).
    deferred: AtomicUsize,
}

impl Selection {
    /// Something that may change what a policy selects happened.
    pub fn touch(&self) {
        self.dirty.store(true, AtomicOrdering::Relaxed);
        self.changes.notify_one();
    }

    /// Work due: 1 while a change waits for its computation, plus the deferred writes.
    pub fn pending(&self) -> usize {
        usize::from(self.dirty.load(AtomicOrdering::Relaxed))
            + self.deferred.load(AtomicOrdering::Relaxed)
    }
}

/// Recomputes and writes the policies' status until shutdown: [`COALESCE`] after a
/// [`Selection::touch`], when a deferred write is due, and every [`RESYNC`]. At shutdown
/// (a leader stepping down or stopping) what is still owed is written at once, within
/// [`FLUSH`], so the next leader finds nothing to write.
pub(super) async fn run(
    context: Arc<Context>,
    selection: Arc<Selection>,
    shutdown: CancellationToken,
) {
    let mut written: HashMap<PolicyKey, Written> = HashMap::new();
    let mut due: Option<Instant> = None;
    loop {
        let wake = due.unwrap_or_else(|| Instant::now() + RESYNC);
        let stop = tokio::select! {
            _ = shutdown.cancelled() => true,
            _ = selection.changes.notified() => {
                tokio::select! {
                    _ = shutdown.cancelled() => true,
                    _ = tokio::time::sleep(COALESCE) => false,
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => false,
        };
        if !context.stores.ready() {
            if stop {
                return;
            }
            due = Some(Instant::now() + COALESCE);
            continue;
        }
        if stop {
            if selection.pending() > 0 {
                selection.dirty.store(false, AtomicOrdering::Relaxed);
                let _ = tokio::time::timeout(FLUSH, pass(&context, &mut written, true)).await;
            }
            return;
        }
        // Changes from here on are for the next computation.
        selection.dirty.store(false, AtomicOrdering::Relaxed);
        let (next, deferred) = pass(&context, &mut written, false).await;
        selection.deferred.store(deferred, AtomicOrdering::Relaxed);
        due = next;
    }
}

/// What selecting reads of a template: its namespace, name and labels.
#[derive(serde::Deserialize)]
struct Selectable {
    metadata: Identity,
}

#[derive(serde::Deserialize)]
struct Identity {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

/// The templates the hub holds now, of every kind it watches, as selecting reads them
/// (only these fields are read back from the store's text: this runs every time a
/// template or policy changes).
fn hub_templates(context: &Context) -> Vec<(usize, Selectable)> {
    context
        .stores
        .templates
        .iter()
        .enumerate()
        .flat_map(|(kind, store)| store.read_all().into_iter().map(move |t| (kind, t)))
        .collect()
}

/// One computation and the writes it calls for (`flush`: without the rate limit); returns
/// when the earliest deferred write is due, and how many are deferred.
async fn pass(
    context: &Context,
    written: &mut HashMap<PolicyKey, Written>,
    flush: bool,
) -> (Option<Instant>, usize) {
    let (policies, cluster_policies) = context.policies();
    let mut candidates: Vec<PolicyCandidate> = Vec::new();
    let mut meta: Vec<(PolicyKey, Option<i64>, Option<&PropagationPolicyStatus>)> = Vec::new();
    for p in &policies {
        candidates.push(PolicyCandidate {
            scope: PolicyScope::Namespaced,
            namespace: p.metadata.namespace.as_deref(),
            name: p.metadata.name.as_deref().unwrap_or_default(),
            spec: &p.spec,
        });
        meta.push((
            key_of(p.as_ref(), false),
            p.metadata.generation,
            p.status.as_ref(),
        ));
    }
    for p in &cluster_policies {
        candidates.push(PolicyCandidate {
            scope: PolicyScope::Cluster,
            namespace: None,
            name: p.metadata.name.as_deref().unwrap_or_default(),
            spec: &p.spec.policy,
        });
        meta.push((
            key_of(p.as_ref(), true),
            p.metadata.generation,
            p.status.as_ref(),
        ));
    }
    let templates = hub_templates(context);
    let refs = templates.iter().map(|(kind, t)| TemplateRef {
        api_version: &context.kinds[*kind].0.api_version,
        kind: &context.kinds[*kind].0.kind,
        namespace: &t.metadata.namespace,
        name: &t.metadata.name,
        labels: t.metadata.labels.as_ref().unwrap_or(&EMPTY),
    });
    let tallies = tally(&candidates, refs);
    let federated: Vec<(&str, &str)> = context
        .kinds
        .iter()
        .map(|(ar, _)| (ar.api_version.as_str(), ar.kind.as_str()))
        .collect();
    let refused = context.state.refusals.load_full();
    let federated = KindSet {
        federated: &federated,
        refused: &refused,
    };

    let now = Instant::now();
    let mut due: Option<Instant> = None;
    let mut deferred = 0;
    written.retain(|key, _| meta.iter().any(|(k, _, _)| k == key));
    for ((policy, tally), (key, generation, current)) in candidates.iter().zip(&tallies).zip(&meta)
    {
        let desired = desired_status(policy, *generation, tally, &federated, *current);
        if current.is_some_and(|c| same_content(c, &desired)) {
            continue;
        }
        // Just written, and the store has not caught up yet.
        if let Some(last) = written.get(key)
            && same_content(&last.status, &desired)
            && now.duration_since(last.at) < 2 * MIN_INTERVAL
        {
            continue;
        }
        if let Some(last) = written.get(key)
            && !flush
            && now.duration_since(last.at) < MIN_INTERVAL
        {
            let at = last.at + MIN_INTERVAL;
            due = Some(due.map_or(at, |d| d.min(at)));
            deferred += 1;
            continue;
        }
        match write(context, policy, &desired).await {
            Ok(()) => {
                context.count_write("policy_status");
                written.insert(
                    key.clone(),
                    Written {
                        status: desired,
                        at: Instant::now(),
                    },
                );
            }
            Err(error) => {
                tracing::debug!(policy = %policy.describe(), %error, "cannot write the policy status; retrying");
                // Counts as an attempt for the rate limit.
                written.insert(
                    key.clone(),
                    Written {
                        status: PropagationPolicyStatus::default(),
                        at: Instant::now(),
                    },
                );
                let at = Instant::now() + MIN_INTERVAL;
                due = Some(due.map_or(at, |d| d.min(at)));
                deferred += 1;
            }
        }
    }
    (due, deferred)
}

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

fn key_of<K: Resource>(object: &K, cluster: bool) -> PolicyKey {
    let meta = object.meta();
    PolicyKey {
        scope_cluster: cluster,
        namespace: meta.namespace.clone(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone(),
    }
}

/// One server-side apply of the status subresource.
async fn write(
    context: &Context,
    policy: &PolicyCandidate<'_>,
    status: &PropagationPolicyStatus,
) -> kube::Result<()> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match (policy.scope, policy.namespace) {
        (PolicyScope::Namespaced, Some(namespace)) => {
            let body = json!({
                "apiVersion": PropagationPolicy::api_version(&()),
                "kind": PropagationPolicy::kind(&()),
                "status": status,
            });
            Api::<PropagationPolicy>::namespaced(context.hub.clone(), namespace)
                .patch_status(policy.name, &params, &Patch::Apply(body))
                .await?;
        }
        _ => {
            let body = json!({
                "apiVersion": ClusterPropagationPolicy::api_version(&()),
                "kind": ClusterPropagationPolicy::kind(&()),
                "status": status,
            });
            Api::<ClusterPropagationPolicy>::all(context.hub.clone())
                .patch_status(policy.name, &params, &Patch::Apply(body))
                .await?;
        }
    }
    tracing::debug!(policy = %policy.describe(), "policy status written");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PropagationSpec;

    fn selector(api_version: &str, kind: &str, name: Option<&str>) -> ResourceSelector {
        ResourceSelector {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.map(str::to_string),
            ..Default::default()
        }
    }

    fn spec(priority: i32, selectors: Vec<ResourceSelector>) -> PropagationSpec {
        PropagationSpec {
            priority,
            resource_selectors: selectors,
            ..Default::default()
        }
    }

    const FEDERATED: &KindSet<'static> = &KindSet {
        federated: &[
            ("apps/v1", "Deployment"),
            ("apps/v1", "StatefulSet"),
            ("v1", "ConfigMap"),
        ],
        refused: &[],
    };

    fn deployment<'a>(
        namespace: &'a str,
        name: &'a str,
        labels: &'a BTreeMap<String, String>,
    ) -> TemplateRef<'a> {
        TemplateRef {
            api_version: "apps/v1",
            kind: "Deployment",
            namespace,
            name,
            labels,
        }
    }

    fn cluster<'a>(name: &'a str, spec: &'a PropagationSpec) -> PolicyCandidate<'a> {
        PolicyCandidate {
            scope: PolicyScope::Cluster,
            namespace: None,
            name,
            spec,
        }
    }

    fn namespaced<'a>(
        ns: &'a str,
        name: &'a str,
        spec: &'a PropagationSpec,
    ) -> PolicyCandidate<'a> {
        PolicyCandidate {
            scope: PolicyScope::Namespaced,
            namespace: Some(ns),
            name,
            spec,
        }
    }

    #[test]
    fn counts_selected_and_placed_per_policy() {
        let labels = BTreeMap::new();
        let mut every = selector("apps/v1", "Deployment", Some("*"));
        every.namespace = Some("default".into());
        let all = spec(0, vec![every]);
        let web = spec(0, vec![selector("apps/v1", "Deployment", Some("web-*"))]);
        let exact = spec(0, vec![selector("apps/v1", "Deployment", Some("web-a"))]);
        let candidates = [
            cluster("all", &all),
            namespaced("default", "web", &web),
            namespaced("default", "exact", &exact),
        ];
        let templates = [
            deployment("default", "web-a", &labels),
            deployment("default", "web-b", &labels),
            deployment("default", "api", &labels),
            deployment("other", "web-c", &labels),
            deployment("kube-system", "web-d", &labels),
        ];
        let tallies = tally(&candidates, templates);
        assert_eq!((tallies[0].selected, tallies[0].placed), (3, 1));
        assert_eq!((tallies[1].selected, tallies[1].placed), (2, 1));
        assert_eq!((tallies[2].selected, tallies[2].placed), (1, 1));
        assert_eq!(
            tallies[0].lost_to,
            BTreeMap::from([
                (
                    "PropagationPolicy default/exact (an exact name)".to_string(),
                    1
                ),
                (
                    "PropagationPolicy default/web (a name pattern)".to_string(),
                    1
                ),
            ])
        );
        assert_eq!(
            tallies[1].selectors,
            [SelectorTally {
                in_scope: 3,
                matched: 2
            }]
        );

        let (status, reason, message) = condition(&candidates[0], &tallies[0], FEDERATED);
        assert_eq!((status, reason), (ConditionStatus::True, "PartlyOutranked"));
        assert!(
            message.starts_with(
                "selects 3 templates and places 1; 2 templates go to policies of higher precedence"
            ) && message.contains("1 to PropagationPolicy default/exact (an exact name)"),
            "{message}"
        );
        let (status, reason, message) = condition(&candidates[2], &tallies[2], FEDERATED);
        assert_eq!(
            (status, reason, message.as_str()),
            (
                ConditionStatus::True,
                "TemplatesSelected",
                "selects 1 template and places it"
            )
        );
    }

    /// A kind discovery refused (here: the hub lacks the permission) is named with the
    /// reason and the fix, not as an unknown kind.
    #[test]
    fn a_refused_kind_says_what_is_missing_and_where() {
        let refused = [crate::hub::federation::discovery::Refusal {
            kind: crate::hub::federation::discovery::Gvk {
                api_version: "v1".into(),
                kind: "PersistentVolumeClaim".into(),
            },
            reason: "the hub may not list persistentvolumeclaims on the hub: grant it (chart value `federatedResources`, docs/operations.md)".into(),
        }];
        let kinds = KindSet {
            federated: FEDERATED.federated,
            refused: &refused,
        };
        let claims = spec(0, vec![selector("v1", "PersistentVolumeClaim", None)]);
        let candidate = cluster("claims", &claims);
        let tallies = tally(std::slice::from_ref(&candidate), []);
        let (status, _, message) = condition(&candidate, &tallies[0], &kinds);
        assert_eq!(status, ConditionStatus::False);
        assert!(
            message.contains("v1 PersistentVolumeClaim cannot be federated: the hub may not list persistentvolumeclaims on the hub: grant it"),
            "{message}"
        );
    }

    #[test]
    fn selecting_nothing_says_why_per_selector() {
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let templates = || {
            [
                deployment("default", "web", &labels),
                deployment("default", "api", &labels),
            ]
        };
        let nothing = |candidate: &PolicyCandidate| {
            let tallies = tally(std::slice::from_ref(candidate), templates());
            let (status, reason, message) = condition(candidate, &tallies[0], FEDERATED);
            assert_eq!(
                (status, reason),
                (ConditionStatus::False, "NothingSelected")
            );
            message
        };

        let typo = spec(0, vec![selector("apps/v1", "Deploymnet", None)]);
        let message = nothing(&cluster("typo", &typo));
        assert!(
            message.contains("resourceSelectors[0] (apps/v1 Deploymnet): apps/v1 Deploymnet is not a kind the hub federates (it federates apps/v1 Deployment, apps/v1 StatefulSet, v1 ConfigMap)"),
            "{message}"
        );
        let version = spec(0, vec![selector("apps/v1beta1", "deployment", None)]);
        assert!(
            nothing(&cluster("v", &version))
                .contains("did you mean apiVersion apps/v1, kind Deployment?")
        );

        let mut elsewhere = selector("apps/v1", "Deployment", Some("*"));
        elsewhere.namespace = Some("prod".into());
        let elsewhere = spec(0, vec![elsewhere]);
        let message = nothing(&cluster("prod", &elsewhere));
        assert!(
            message.contains("no Deployment in namespace prod yet (the selector's namespace must be the templates' namespace"),
            "{message}"
        );

        let own = spec(0, vec![selector("apps/v1", "Deployment", None)]);
        let message = nothing(&namespaced("shop", "own", &own));
        assert!(
            message.contains("no Deployment in namespace shop yet (a PropagationPolicy selects only in its own namespace"),
            "{message}"
        );

        let pattern = spec(0, vec![selector("apps/v1", "Deployment", Some("db-*"))]);
        let message = nothing(&namespaced("default", "db", &pattern));
        assert!(
            message.contains("2 Deployment templates in namespace default, but none matches the name pattern db-*"),
            "{message}"
        );
        let exact = spec(0, vec![selector("apps/v1", "Deployment", Some("db"))]);
        assert!(nothing(&namespaced("default", "db", &exact)).contains("none is named db"));

        let mut system = selector("apps/v1", "Deployment", None);
        system.namespace = Some("kube-system".into());
        let system = spec(0, vec![system]);
        assert!(
            nothing(&cluster("sys", &system)).contains("namespace kube-system is never federated")
        );
    }

    #[test]
    fn the_status_keeps_its_transition_time_and_compares_by_content() {
        let labels = BTreeMap::new();
        let web = spec(0, vec![selector("apps/v1", "Deployment", Some("web"))]);
        let policy = namespaced("default", "web", &web);
        let one = tally(&[policy], [deployment("default", "web", &labels)]);
        let first = desired_status(&policy, Some(1), &one[0], FEDERATED, None);
        assert_eq!((first.selected_templates, first.placed_templates), (1, 1));
        let mut stored = first.clone();
        stored.conditions[0].last_transition_time =
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::from_second(1_000).unwrap(),
            );
        let again = desired_status(&policy, Some(1), &one[0], FEDERATED, Some(&stored));
        assert!(same_content(&again, &stored));
        assert_eq!(
            again.conditions[0].last_transition_time,
            stored.conditions[0].last_transition_time
        );
        let none = tally(&[policy], []);
        let gone = desired_status(&policy, Some(1), &none[0], FEDERATED, Some(&stored));
        assert!(!same_content(&gone, &stored));
        assert_eq!(gone.conditions[0].status, "False");
        let newer = desired_status(&policy, Some(2), &one[0], FEDERATED, Some(&stored));
        assert!(
            !same_content(&newer, &stored),
            "a new generation is new content"
        );
    }

    #[test]
    fn a_status_only_update_of_a_policy_triggers_nothing() {
        let mut policy = PropagationPolicy::new(
            "web",
            spec(0, vec![selector("apps/v1", "Deployment", Some("web"))]),
        );
        policy.metadata.namespace = Some("shop".into());
        policy.metadata.resource_version = Some("1".into());
        let mut trigger =
            spec_changes(|_event: watcher::Event<PropagationPolicy>| super::super::Trigger::All);
        let is_all = |t: super::super::Trigger| matches!(t, super::super::Trigger::All);
        assert!(is_all(trigger(watcher::Event::Apply(policy.clone()))));
        let mut status_only = policy.clone();
        status_only.metadata.resource_version = Some("2".into());
        status_only.status = Some(PropagationPolicyStatus {
            selected_templates: 1,
            ..Default::default()
        });
        assert!(!is_all(trigger(watcher::Event::Apply(status_only.clone()))));
        let mut changed = status_only.clone();
        changed.spec.priority = 5;
        assert!(is_all(trigger(watcher::Event::Apply(changed.clone()))));
        assert!(is_all(trigger(watcher::Event::Delete(changed.clone()))));
        assert!(
            is_all(trigger(watcher::Event::Apply(changed))),
            "re-created"
        );
    }
}
