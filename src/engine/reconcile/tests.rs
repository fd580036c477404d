use k8s_openapi::api::core::v1::Pod;

use super::warned::WARNED_MAX;
use super::*;
use crate::engine::EngineError;
use crate::engine::api::ApiError;
use crate::engine::store::Item;
use crate::model::backoff::WATCH_CUT_SHORT;
use crate::model::backoff::WatchBackoff;
use crate::model::resolve::Missing;
use drafs_test_support::{Build, ClaimBuilder, PodBuilder, SliceBuilder};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

const NS: &str = "ns";

/// The time every input of a test arrives at, unless it says otherwise.
fn t0() -> Instant {
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *T0.get_or_init(Instant::now)
}

fn pod_ref() -> PodRef {
    PodRef { namespace: NS.into(), name: "p".into() }
}

/// Pod `p` on n1 with these claims (`template:T` for one from template T)
/// and the template claims' status entries.
fn pod_builder(claims: &[(&str, &str)], generated: &[(&str, &str)]) -> PodBuilder {
    let mut p = PodBuilder::new(NS, "p").uid("u1").node("n1");
    for (n, c) in claims {
        p = match c.strip_prefix("template:") {
            Some(t) => p.template_claim(n, t),
            None => p.claim(n, c),
        };
    }
    p.generated(generated)
}

fn pod(claims: &[(&str, &str)], generated: &[(&str, &str)]) -> Input {
    Input::Pod(Box::new(pod_builder(claims, generated).decode()))
}

fn claim(name: &str, devices: &[&str]) -> Item {
    let mut c = ClaimBuilder::new(NS, name).resource_version("5");
    for d in devices {
        c = c.result("gpu", "gpu.example.com", "n1", d);
    }
    Item::Claim(Box::new(c.decode()))
}

fn slice(name: &str, node: Option<&str>, generation: i64, devices: &[(&str, &str)]) -> Item {
    let mut s = SliceBuilder::new(name, "gpu.example.com", "n1").resource_version("9").generation(generation);
    s = match node {
        Some(n) => s.node(n),
        None => s.all_nodes(),
    };
    for (d, uuid) in devices {
        s = s.device(d, json!({"uuid": {"string": uuid}}));
    }
    Item::Slice(Box::new(s.decode()))
}

fn claim_scope(name: &str) -> Scope {
    Scope::Claim(name.into())
}

fn node_scope() -> Scope {
    Scope::NodeSlices("n1".into())
}

fn ended(scope: Scope, lasted: Duration, changes: usize) -> Input {
    Input::WatchEnded { scope, lasted, changes }
}

fn listed(scope: Scope, items: Vec<Item>, filter: Option<&DeviceFilter>) -> Input {
    Input::Listed { scope, items, resource_version: "10".into(), decoded_with: filter.cloned() }
}

fn filter_of(step: &Step) -> Option<DeviceFilter> {
    step.actions.iter().find_map(|a| match a {
        Action::Filter(f) => Some(f.clone()),
        _ => None,
    })
}

fn lists(step: &Step) -> Vec<Scope> {
    step.actions
        .iter()
        .filter_map(|a| match a {
            Action::List { scope, .. } => Some(scope.clone()),
            _ => None,
        })
        .collect()
}

fn watches(step: &Step) -> Vec<Scope> {
    step.actions
        .iter()
        .filter_map(|a| match a {
            Action::Watch { scope, .. } => Some(scope.clone()),
            _ => None,
        })
        .collect()
}

fn uuid(p: &Publication) -> String {
    String::from_utf8(p.built.tree.get("gpu/gpu/0/uuid").unwrap_or_default().to_vec()).unwrap()
}

/// Pod, then its claim and the node's slices listed: the first reads.
fn first_reads(r: &mut Reconciler, devices: &[&str], slices: Vec<Item>) -> (Step, Step) {
    assert_eq!(r.start(t0()).actions, vec![Action::GetPod { after: Duration::ZERO }]);
    let step = r.handle(t0(), pod(&[("gpu", "c")], &[]));
    assert_eq!(lists(&step), vec![claim_scope("c"), node_scope()], "claim and slices listed together");
    assert_eq!(r.phase(), Phase::WaitingForClaims);
    let claims = r.handle(t0(), listed(claim_scope("c"), vec![claim("c", devices)], None));
    let filter = filter_of(&claims).expect("the filter once the claims are listed");
    let slices = r.handle(t0(), listed(node_scope(), slices, Some(&filter)));
    (claims, slices)
}

#[test]
fn init_ready_from_the_first_reads_publishes_and_stops_without_a_watch() {
    let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
    let (claims, step) = first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "U0"), ("g1", "U1")])]);
    assert_eq!(filter_of(&claims).unwrap().len(), 1);
    assert!(matches!(step.transition, Some(Transition::Ready { .. })), "{:?}", step.transition);
    assert_eq!(uuid(step.publish.as_ref().unwrap()), "U0");
    assert!(step.publish.as_ref().unwrap().built.tree.get("gpu/gpu/1/uuid").is_none());
    assert!(matches!(step.done, Some(Ok(_))));
    assert!(watches(&step).is_empty() && lists(&step).is_empty(), "{:?}", step.actions);
    assert_eq!(r.phase(), Phase::Ready);
    // Nothing after the end.
    assert!(r.handle(t0(), Input::Deadline).done.is_none());
}

#[test]
fn init_watches_only_the_unallocated_claim_then_fetches_the_devices_again() {
    let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
    let (_, step) = first_reads(&mut r, &[], vec![slice("s", Some("n1"), 1, &[("g0", "U0")])]);
    assert!(step.done.is_none() && step.publish.is_none());
    assert_eq!(watches(&step), vec![claim_scope("c")], "only the claim can bring what is missing");
    assert!(matches!(&step.transition, Some(Transition::Waiting { missing }) if missing[0].contains("not allocated")));
    assert_eq!(r.phase(), Phase::WaitingForClaims);
    // The allocation arrives: the slices were kept without g0, so they are listed again.
    let step = r.handle(t0(), Input::Applied { scope: claim_scope("c"), item: claim("c", &["g0"]) });
    let filter = filter_of(&step).unwrap();
    assert_eq!(lists(&step), vec![node_scope()]);
    assert!(step.publish.is_none(), "no resolution from slices decoded without the device");
    let step = r.handle(t0(), listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "U0")])], Some(&filter)));
    assert_eq!(uuid(step.publish.as_ref().unwrap()), "U0");
    assert!(matches!(step.done, Some(Ok(_))));
}

#[test]
fn a_device_on_no_node_slice_lists_then_watches_its_drivers_unbound_slices() {
    let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
    let (_, step) = first_reads(&mut r, &["g0"], vec![]);
    let driver = Scope::DriverSlices("gpu.example.com".into());
    assert_eq!(lists(&step), vec![driver.clone()]);
    assert!(watches(&step).is_empty(), "first the unbound slices are listed");
    let filter = r.filter.clone().unwrap();
    let step = r.handle(t0(), listed(driver.clone(), vec![], Some(&filter)));
    assert_eq!(watches(&step), vec![node_scope(), driver.clone()], "the claim is there: only slices are watched");
    assert_eq!(r.phase(), Phase::WaitingForDevices);
    let step = r.handle(t0(), Input::Applied { scope: driver, item: slice("shared", None, 1, &[("g0", "SHARED")]) });
    assert_eq!(uuid(step.publish.as_ref().unwrap()), "SHARED");
    assert!(matches!(step.done, Some(Ok(_))));
}

#[test]
fn serve_follows_every_scope_once_and_reports_each_transition() {
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    let (_, step) = first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
    assert!(matches!(step.transition, Some(Transition::Ready { .. })));
    assert!(step.done.is_none());
    assert_eq!(watches(&step), vec![claim_scope("c"), node_scope()]);
    // An update: published, and no second watch for the same scope.
    let step = r.handle(t0(), Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "B")]) });
    assert_eq!(step.transition, Some(Transition::Updated));
    assert_eq!(uuid(step.publish.as_ref().unwrap()), "B");
    assert!(watches(&step).is_empty());
    // The same again: nothing to publish.
    let step = r.handle(t0(), Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "B")]) });
    assert!(step.publish.is_none() && step.transition.is_none());
    // The slice goes: first the driver's unbound slices are looked at,
    // then the tree is kept while the pool may come back, then the values are lost.
    let step =
        r.handle(t0(), Input::Deleted { scope: node_scope(), name: "s".into(), resource_version: Some("11".into()) });
    let driver = Scope::DriverSlices("gpu.example.com".into());
    assert_eq!(lists(&step), vec![driver.clone()]);
    assert!(step.transition.is_none());
    let filter = r.filter.clone().unwrap();
    let step = r.handle(t0(), listed(driver.clone(), vec![], Some(&filter)));
    assert!(step.transition.is_none() && step.publish.is_none(), "kept while its pool may come back");
    assert!(step.actions.contains(&Action::Recheck { after: VANISHED_POOL_GRACE }));
    assert_eq!(watches(&step), vec![driver], "the new scope is followed too");
    let step = r.handle(t0() + VANISHED_POOL_GRACE, Input::Recheck);
    assert!(matches!(&step.transition, Some(Transition::Lost { missing }) if !missing.is_empty()));
    assert_eq!(r.phase(), Phase::Degraded);
    let step = r.handle(t0(), Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 2, &[("g0", "C")]) });
    assert_eq!(step.transition, Some(Transition::Recovered));
    assert_eq!(uuid(step.publish.as_ref().unwrap()), "C");
    // A watch that ends is resumed from the last version seen; an expired one is listed again.
    let step =
        r.handle(t0(), ended(node_scope(), Duration::from_secs(crate::engine::api::WATCH_SECONDS_MIN.into()), 0));
    assert!(
        matches!(&step.actions[..], [Action::Watch { scope, resource_version, after }] if *scope == node_scope() && resource_version == "9" && after.is_zero())
    );
    let step = r.handle(t0(), Input::Expired(node_scope()));
    assert_eq!(lists(&step), vec![node_scope()]);
    assert!(watches(&step).is_empty(), "no watch while the relist runs");
    // After ready, the deadline no longer applies.
    assert!(r.handle(t0(), Input::Deadline).done.is_none());
}

/// A kubelet starting deletes its node's slices; the driver publishes
/// them again a while later: the tree served meanwhile is the last one,
/// whole, and what changed while the pool was gone shows once it is back.
#[test]
fn a_pool_gone_for_a_while_keeps_the_tree_and_one_the_driver_changed_does_not() {
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    let driver = Scope::DriverSlices("gpu.example.com".into());
    first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
    r.handle(t0(), Input::Deleted { scope: node_scope(), name: "s".into(), resource_version: None });
    let filter = r.filter.clone().unwrap();
    let step = r.handle(t0(), listed(driver.clone(), vec![], Some(&filter)));
    assert!(step.publish.is_none() && step.transition.is_none());
    assert!(
        step.warnings.iter().any(|w| w.contains("gpu.example.com/n1") && w.contains("kept")),
        "{:?}",
        step.warnings
    );
    assert_eq!(r.phase(), Phase::Ready);
    // Back before the grace ends, changed: published as an update, the loss never shown.
    let later = t0() + VANISHED_POOL_GRACE / 2;
    let step = r.handle(later, Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 2, &[("g0", "B")]) });
    assert_eq!(step.transition, Some(Transition::Updated));
    assert_eq!(uuid(step.publish.as_ref().unwrap()), "B");
    // The recheck asked for then finds nothing to do.
    let step = r.handle(t0() + VANISHED_POOL_GRACE, Input::Recheck);
    assert!(step.publish.is_none() && step.transition.is_none());
    // Gone a second time: a new grace from then, not what is left of the first.
    let again = t0() + VANISHED_POOL_GRACE * 2;
    let step = r.handle(again, Input::Deleted { scope: node_scope(), name: "s".into(), resource_version: None });
    assert!(step.transition.is_none() && step.actions.contains(&Action::Recheck { after: VANISHED_POOL_GRACE }));
    let step = r.handle(again + VANISHED_POOL_GRACE / 2, Input::Recheck);
    assert!(step.transition.is_none(), "still within the second grace");
    // A pool that is there and no longer lists the device: lost at once.
    let step = r.handle(
        again + VANISHED_POOL_GRACE / 2,
        Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 3, &[("g1", "C")]) },
    );
    assert!(
        matches!(&step.transition, Some(Transition::Lost { missing }) if missing[0].contains("does not list it")),
        "{:?}",
        step.transition
    );
}

/// The pod as fetched at resource version `rv`, with the kubelet's health of g0.
fn pod_at(rv: &str, health: Option<&str>) -> Box<Pod> {
    let mut p = pod_builder(&[("gpu", "c")], &[]).resource_version(rv);
    if let Some(h) = health {
        p = p.container_status(
            "app",
            json!([{"name": "claim:gpu", "resources": [{"resourceID": "gpu.example.com/n1/g0", "health": h}]}]),
        );
    }
    Box::new(p.decode())
}

/// `serve` ready from the first reads, the pod fetched at version 3: the
/// reconciler and the step that made it ready.
fn serving_pod_at_version_3() -> (Reconciler, Step) {
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    r.start(t0());
    r.handle(t0(), Input::Pod(pod_at("3", None)));
    let claims = r.handle(t0(), listed(claim_scope("c"), vec![claim("c", &["g0"])], None));
    let filter = filter_of(&claims).unwrap();
    let step = r.handle(t0(), listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "A")])], Some(&filter)));
    (r, step)
}

#[test]
fn serve_watches_the_pod_from_its_fetched_version_and_only_gets_it_again() {
    let pod_scope = Scope::Pod("p".into());
    let (mut r, step) = serving_pod_at_version_3();
    assert!(matches!(step.transition, Some(Transition::Ready { .. })));
    assert!(step.actions.iter().any(|a| matches!(a, Action::Watch { scope, resource_version, .. }
        if *scope == pod_scope && resource_version == "3")));
    assert!(step.publish.unwrap().built.tree.get("gpu/gpu/0/.health").is_none());
    // The kubelet reports the device: the watch brings the pod, the tree has its health.
    let step =
        r.handle(t0(), Input::Applied { scope: pod_scope.clone(), item: Item::Pod(pod_at("4", Some("Unhealthy"))) });
    assert_eq!(step.transition, Some(Transition::Updated));
    assert_eq!(step.publish.unwrap().built.tree.get("gpu/gpu/0/.health"), Some(&b"Unhealthy"[..]));
    // Another pod on the pod's watch is not taken.
    let mut other = pod_at("5", Some("Healthy"));
    other.metadata.name = Some("q".into());
    let step = r.handle(t0(), Input::Applied { scope: pod_scope.clone(), item: Item::Pod(other) });
    assert!(step.publish.is_none());
    assert!(step.actions.iter().any(|a| matches!(a, Action::GetPod { .. })), "the pod is fetched again");
    r.handle(t0(), Input::Pod(pod_at("6", Some("Unhealthy"))));
    // 410 Gone: the pod is fetched again (never listed), and watched from that answer.
    r.handle(t0(), ended(pod_scope.clone(), Duration::from_secs(crate::engine::api::WATCH_SECONDS_MIN.into()), 1));
    let step = r.handle(t0(), Input::Expired(pod_scope.clone()));
    assert!(step.actions.iter().any(|a| matches!(a, Action::GetPod { .. })), "{:?}", step.actions);
    assert!(lists(&step).is_empty() && watches(&step).is_empty());
    let step = r.handle(t0(), Input::Pod(pod_at("9", Some("Healthy"))));
    assert!(step.actions.iter().any(|a| matches!(a, Action::Watch { scope, resource_version, .. }
        if *scope == pod_scope && resource_version == "9")));
    assert_eq!(step.publish.unwrap().built.tree.get("gpu/gpu/0/.health"), Some(&b"Healthy"[..]));
    // Forbidden (RBAC without watch on pods): a warning, and no more tries.
    let forbidden =
        ApiError::Forbidden { verb: "watch", resource: "pods".into(), scope: String::new(), message: "no".into() };
    let step = r.handle(t0(), Input::Failed { scope: pod_scope.clone(), error: forbidden });
    assert!(step.done.is_none(), "serve goes on");
    assert!(step.warnings.iter().any(|w| w.contains("device health will not follow")), "{:?}", step.warnings);
    assert!(step.actions.is_empty());
    let step = r.handle(t0(), Input::Pod(pod_at("12", Some("Unhealthy"))));
    assert!(watches(&step).is_empty(), "{:?}", step.actions);
}

/// After ready, fetching the pod again (its watch expired) during an outage
/// retries on the run's trouble backoff (up to 30 s), not the start-up one
/// (up to 5 s): an outage costs as few requests as for any other scope.
#[test]
fn refetching_the_pod_after_ready_backs_off_like_every_other_scope() {
    let (mut r, ready) = serving_pod_at_version_3();
    assert!(matches!(ready.transition, Some(Transition::Ready { .. })));
    let step = r.handle(t0(), Input::Expired(Scope::Pod("p".into())));
    assert!(step.actions.iter().any(|a| matches!(a, Action::GetPod { .. })));
    let mut delays = Vec::new();
    for _ in 0..6 {
        let failed = ApiError::Failed {
            verb: "get",
            resource: "pods".into(),
            scope: String::new(),
            message: "HTTP 503".into(),
            code: Some(503),
        };
        let step = r.handle(t0(), Input::PodFailed(failed));
        assert!(step.done.is_none(), "serve goes on");
        delays.extend(step.actions.iter().filter_map(|a| match a {
            Action::GetPod { after } => Some(*after),
            _ => None,
        }));
    }
    assert_eq!(delays.len(), 6, "one retry per failure");
    assert!(delays.iter().max().unwrap() > &Duration::from_secs(5), "{delays:?}");
}

/// `init` never watches the pod.
#[test]
fn init_does_not_follow_the_pod() {
    let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
    r.start(t0());
    let step = r.handle(t0(), Input::Pod(pod_at("3", None)));
    assert!(!r.store.has_scope(&Scope::Pod("p".into())));
    assert!(watches(&step).is_empty());
}

#[test]
fn api_errors_end_a_run_only_while_not_ready() {
    let forbidden = ApiError::Forbidden {
        verb: "list",
        resource: "resourceslices".into(),
        scope: String::new(),
        message: "no".into(),
    };
    let failed = ApiError::Failed {
        verb: "list",
        resource: "resourceslices".into(),
        scope: String::new(),
        message: "HTTP 500".into(),
        code: Some(500),
    };
    // Before ready: 403 ends the run; 500 is retried with growing delays.
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    r.start(t0());
    r.handle(t0(), pod(&[("gpu", "c")], &[]));
    let step = r.handle(t0(), Input::Failed { scope: node_scope(), error: failed.clone() });
    assert!(matches!(&step.actions[..], [Action::List { after, .. }] if *after == Duration::from_millis(200)));
    assert_eq!(step.warnings.len(), 1);
    let step = r.handle(t0(), Input::Failed { scope: node_scope(), error: failed.clone() });
    assert!(matches!(&step.actions[..], [Action::List { after, .. }] if *after == Duration::from_millis(400)));
    assert!(step.warnings.is_empty(), "the same warning is not repeated");
    let waiting = r.waiting_for().join("; ");
    assert!(waiting.contains("not listed yet: cannot list") || waiting.contains("HTTP 500"), "{waiting}");
    let step = r.handle(t0(), Input::Failed { scope: node_scope(), error: forbidden.clone() });
    assert!(matches!(step.done, Some(Err(EngineError::Api(ApiError::Forbidden { .. })))));
    // After ready: the same 403 is retried and the last tree stays.
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
    let step = r.handle(t0(), Input::Failed { scope: node_scope(), error: forbidden });
    assert!(step.done.is_none() && step.publish.is_none());
    assert_eq!(lists(&step), vec![node_scope()]);
}

#[test]
fn the_deadline_says_what_is_still_missing() {
    let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
    r.start(t0());
    let step = r.handle(
        t0(),
        Input::PodFailed(ApiError::Failed {
            verb: "get",
            resource: "pods".into(),
            scope: " (ns/p)".into(),
            message: "no answer within 3000 ms".into(),
            code: None,
        }),
    );
    assert!(matches!(step.actions[..], [Action::GetPod { .. }]));
    let step = r.handle(t0(), Input::Deadline);
    let Some(Err(EngineError::Timeout { waiting_for })) = step.done else { panic!("{:?}", step.done) };
    assert_eq!(waiting_for.len(), 1);
    assert!(
        waiting_for[0].contains("pod ns/p not fetched yet") && waiting_for[0].contains("no answer"),
        "{waiting_for:?}"
    );

    let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
    first_reads(&mut r, &[], vec![]);
    let Some(Err(EngineError::Timeout { waiting_for })) = r.handle(t0(), Input::Deadline).done else { panic!() };
    assert!(waiting_for[0].contains("ResourceClaim c is not allocated yet"), "{waiting_for:?}");
}

#[test]
fn a_generated_claim_not_in_the_pod_status_refetches_the_pod() {
    let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
    r.start(t0());
    let step = r.handle(t0(), pod(&[("gpu", "template:t")], &[]));
    assert_eq!(lists(&step), vec![node_scope()], "no claim to list yet");
    let filter = filter_of(&step).unwrap();
    let step = r.handle(t0(), listed(node_scope(), vec![], Some(&filter)));
    assert!(matches!(&step.actions[..], [Action::GetPod { after }] if *after > Duration::ZERO), "{:?}", step.actions);
    assert_eq!(r.phase(), Phase::WaitingForClaims);
    let step = r.handle(t0(), pod(&[("gpu", "template:t")], &[("gpu", "p-gpu-x")]));
    assert_eq!(lists(&step), vec![claim_scope("p-gpu-x")]);
}

#[test]
fn a_claim_the_pod_does_not_have_ends_the_run_at_once() {
    let sel = Selection { claims: vec!["nope".into()] };
    let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), sel, vec![]);
    r.start(t0());
    let step = r.handle(t0(), pod(&[("gpu", "c")], &[]));
    let step = if step.done.is_some() { step } else { r.handle(t0(), listed(node_scope(), vec![], None)) };
    assert!(matches!(step.done, Some(Err(EngineError::Permanent(Missing::UnknownClaim { .. })))), "{:?}", step.done);
}

#[test]
fn a_pod_that_is_not_the_one_asked_for_is_not_used() {
    let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
    r.start(t0());
    let Input::Pod(mut other) = pod(&[("gpu", "c")], &[]) else { unreachable!() };
    other.metadata.name = Some("someone-else".into());
    let step = r.handle(t0(), Input::Pod(other));
    assert!(matches!(&step.actions[..], [Action::GetPod { after }] if *after > Duration::ZERO), "{:?}", step.actions);
    assert!(step.warnings[0].contains("answered with pod ns/someone-else"), "{:?}", step.warnings);
    assert_eq!(r.phase(), Phase::WaitingForPod);
}

#[test]
fn objects_outside_a_scope_are_ignored_with_a_warning() {
    let mut r = Reconciler::new(Mode::Once, pod_ref(), Selection::default(), vec![]);
    r.start(t0());
    r.handle(t0(), pod(&[("gpu", "c")], &[]));
    // A server that ignored the selectors: another claim, and a claim of another namespace.
    let mut foreign: ResourceClaim = match claim("c", &["g0"]) {
        Item::Claim(c) => *c,
        _ => unreachable!(),
    };
    foreign.metadata.namespace = Some("other".into());
    let step =
        r.handle(t0(), listed(claim_scope("c"), vec![claim("x", &["g9"]), Item::Claim(Box::new(foreign))], None));
    assert_eq!(step.warnings.len(), 2, "{:?}", step.warnings);
    let filter = filter_of(&step).unwrap();
    assert!(filter.is_empty(), "nothing of the foreign claims is wanted");
    // Another node's slice on the node's watch is ignored too.
    let step = r.handle(t0(), listed(node_scope(), vec![slice("s", Some("n2"), 1, &[("g0", "X")])], Some(&filter)));
    assert_eq!(step.warnings.len(), 1);
    let Some(Ok(res)) = step.done else { panic!() };
    assert!(res.missing.iter().any(|m| matches!(m, Missing::ClaimNotFound { .. })));
}

#[test]
fn a_flood_of_distinct_warnings_is_reported_once_each_and_remembered_within_a_bound() {
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
    assert_eq!(r.phase(), Phase::Ready);
    // A server that ignores the claim watch's field selector sends every
    // claim of the cluster: 100,000 distinct ones, each ignored with a warning.
    let other = |i: usize| {
        let metadata =
            ObjectMeta { name: Some(format!("other-{i}")), namespace: Some(NS.into()), ..Default::default() };
        let claim = ResourceClaim { metadata, ..Default::default() };
        Input::Applied { scope: claim_scope("c"), item: Item::Claim(Box::new(claim)) }
    };
    let mut reported = 0;
    for i in 0..100_000 {
        reported += r.absorb(t0(), [other(i)]).warnings.len();
        assert!(r.warned.len() <= WARNED_MAX, "{} warnings kept", r.warned.len());
    }
    assert_eq!(reported, 100_000, "each reported once");
    // The last WARNED_MAX are remembered: not reported again.
    assert!(r.absorb(t0(), [other(99_999), other(100_000 - WARNED_MAX)]).warnings.is_empty());
    // The first were forgotten: reported once more.
    assert_eq!(r.absorb(t0(), [other(0)]).warnings.len(), 1);
    // The pod's tree is unchanged throughout.
    let step = r.settle(t0());
    assert!(step.publish.is_none() && step.warnings.is_empty(), "{:?}", step.warnings);
    assert_eq!(r.phase(), Phase::Ready);
}

#[test]
fn once_mode_answers_after_the_lists_without_watching() {
    let mut r = Reconciler::new(Mode::Once, pod_ref(), Selection::default(), vec![]);
    let (_, step) = first_reads(&mut r, &["g0"], vec![]);
    // A device is missing: the driver's unbound slices are listed first.
    let driver = Scope::DriverSlices("gpu.example.com".into());
    assert_eq!(lists(&step), vec![driver.clone()]);
    let filter = r.filter.clone().unwrap();
    let step = r.handle(t0(), listed(driver, vec![], Some(&filter)));
    assert!(watches(&step).is_empty() && step.publish.is_none());
    let Some(Ok(res)) = step.done else { panic!("{:?}", step.done) };
    assert!(!res.is_complete());
}

fn watch_after(step: &Step, want: &Scope) -> Option<Duration> {
    step.actions.iter().find_map(|a| match a {
        Action::Watch { scope, after, .. } if scope == want => Some(*after),
        _ => None,
    })
}

fn list_after(step: &Step, want: &Scope) -> Option<Duration> {
    step.actions.iter().find_map(|a| match a {
        Action::List { scope, after } if scope == want => Some(*after),
        _ => None,
    })
}

#[test]
fn failing_watches_back_off_and_a_successful_list_does_not_reset_it() {
    let failed = |verb| Input::Failed {
        scope: node_scope(),
        error: ApiError::Forbidden {
            verb,
            resource: "resourceslices".into(),
            scope: String::new(),
            message: "no watch".into(),
        },
    };
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    let (_, step) = first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
    assert_eq!(watch_after(&step, &node_scope()), Some(Duration::ZERO), "the first watch at once");
    // A watch the server refuses: watched again from the same version, later (no list needed).
    let step = r.handle(t0(), failed("watch"));
    let first = watch_after(&step, &node_scope()).expect("watched again");
    assert!(first >= WatchBackoff::INITIAL, "{first:?}");
    assert!(lists(&step).is_empty() && step.publish.is_none());
    let step = r.handle(t0(), failed("watch"));
    let second = watch_after(&step, &node_scope()).unwrap();
    assert!(second >= 2 * WatchBackoff::INITIAL, "{second:?} after {first:?}");
    // 410 Gone: listed again after a delay; the list succeeds, and the
    // next trouble still waits longer (client-go's reflector does the same).
    let step = r.handle(t0(), Input::Expired(node_scope()));
    let relist = list_after(&step, &node_scope()).expect("relisted");
    assert!(relist >= 4 * WatchBackoff::INITIAL, "{relist:?}");
    let step = r.handle(t0(), listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "A")])], r.filter.as_ref()));
    assert_eq!(watch_after(&step, &node_scope()), Some(Duration::ZERO), "a fresh list is watched at once");
    let step = r.handle(t0(), Input::Expired(node_scope()));
    let later = list_after(&step, &node_scope()).unwrap();
    assert!(later >= 8 * WatchBackoff::INITIAL && later <= WatchBackoff::CAP, "{later:?}");
    // One backoff for the run: another scope's trouble goes on from there.
    let step = r.handle(t0(), Input::Expired(claim_scope("c")));
    let claim = list_after(&step, &claim_scope("c")).unwrap();
    assert!(claim >= 16 * WatchBackoff::INITIAL && claim <= WatchBackoff::CAP, "{claim:?}");
}

#[test]
fn a_watch_cut_short_without_a_change_is_resumed_later() {
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
    // Closed at once with nothing: resumed after a delay that grows.
    let step = r.handle(t0(), ended(node_scope(), Duration::from_millis(3), 0));
    let first = watch_after(&step, &node_scope()).expect("resumed");
    assert!(first >= WatchBackoff::INITIAL, "{first:?}");
    let step = r.handle(t0(), ended(node_scope(), Duration::from_millis(3), 0));
    assert!(watch_after(&step, &node_scope()).unwrap() > first);
    // Closed early, but it brought a change: resumed at once.
    let step = r.handle(t0(), ended(node_scope(), Duration::from_millis(3), 1));
    assert_eq!(watch_after(&step, &node_scope()), Some(Duration::ZERO));
    // Closed when its time was up: resumed at once.
    let step = r.handle(t0(), ended(claim_scope("c"), WATCH_CUT_SHORT, 0));
    assert_eq!(watch_after(&step, &claim_scope("c")), Some(Duration::ZERO));
}

#[test]
fn the_pod_is_fetched_again_with_growing_delays_while_its_claim_is_pending() {
    let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
    r.start(t0());
    let step = r.handle(t0(), pod(&[("gpu", "template:t")], &[]));
    let filter = filter_of(&step).unwrap();
    let step = r.handle(t0(), listed(node_scope(), vec![], Some(&filter)));
    let mut delays = Vec::new();
    let mut step = step;
    for _ in 0..4 {
        let after = step.actions.iter().find_map(|a| match a {
            Action::GetPod { after } => Some(*after),
            _ => None,
        });
        delays.push(after.expect("the pod again"));
        // The pod comes back, still without the generated claim.
        step = r.handle(t0(), pod(&[("gpu", "template:t")], &[]));
    }
    assert!(delays.windows(2).all(|w| w[1] > w[0]), "an answer does not reset the delay: {delays:?}");
}

#[test]
fn a_batch_of_inputs_resolves_once_to_the_latest_state() {
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
    let burst = ["B", "C", "D"]
        .map(|uuid| Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", uuid)]) });
    let step = r.handle_all(t0(), burst);
    assert_eq!(uuid(step.publish.as_ref().expect("one publication")), "D");
    assert_eq!(step.transition, Some(Transition::Updated));
    // A change and its undoing in one batch: nothing to publish.
    let step = r.handle_all(
        t0(),
        [
            Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "E")]) },
            Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "D")]) },
        ],
    );
    assert!(step.publish.is_none() && step.transition.is_none());
    // Taken in while a tree is written, resolved once afterwards.
    for uuid in ["F", "G"] {
        let step =
            r.absorb(t0(), [Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", uuid)]) }]);
        assert!(step.publish.is_none() && step.actions.is_empty());
    }
    assert!(r.is_unsettled());
    assert_eq!(uuid(r.settle(t0()).publish.as_ref().unwrap()), "G");
    assert!(!r.is_unsettled() && r.settle(t0()).publish.is_none());
}

/// Once ready, a run never goes back to waiting: the pod gains a claim
/// (its status names a generated one) and while that claim is listed, the
/// tree published stays served and the run stays ready.
#[test]
fn a_ready_run_stays_ready_while_a_new_scope_is_listed() {
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
    assert_eq!(r.phase(), Phase::Ready);
    let step = r.handle(t0(), pod(&[("gpu", "c"), ("extra", "template:t")], &[("extra", "p-extra-x")]));
    assert_eq!(lists(&step), vec![claim_scope("p-extra-x")]);
    assert_eq!(r.phase(), Phase::Ready, "the published tree is still served");
    assert!(step.transition.is_none() && step.publish.is_none());
    assert!(r.handle(t0(), Input::Deadline).done.is_none(), "no deadline after ready");
}

/// The clock is an input: the summary counts from `start`, and the run's
/// backoff forgets trouble after a quiet spell of RESET_AFTER.
#[test]
fn time_comes_with_the_inputs() {
    let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
    r.start(t0());
    let later = t0() + Duration::from_millis(1500);
    r.handle(later, pod(&[("gpu", "c")], &[]));
    let claims = r.handle(later, listed(claim_scope("c"), vec![claim("c", &["g0"])], None));
    let filter = filter_of(&claims).unwrap();
    let step = r.handle(later, listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "A")])], Some(&filter)));
    assert!(
        matches!(&step.transition, Some(Transition::Ready { summary }) if summary.ends_with("after 1500 ms")),
        "{:?}",
        step.transition
    );
    let mut at = later;
    let mut last = Duration::ZERO;
    for _ in 0..4 {
        let step = r.handle(at, Input::Expired(node_scope()));
        last = list_after(&step, &node_scope()).unwrap();
        r.handle(at, listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "A")])], Some(&filter)));
    }
    assert!(last >= 8 * WatchBackoff::INITIAL, "{last:?}");
    at += last + WatchBackoff::RESET_AFTER;
    let step = r.handle(at, Input::Expired(node_scope()));
    let after = list_after(&step, &node_scope()).unwrap();
    assert!(after < 2 * WatchBackoff::INITIAL, "a quiet spell resets the backoff: {after:?}");
}
