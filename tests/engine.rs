//! The engine against the test API server: the I/O half in process (the engine
//! and the reconciler, without spawning the binary), then the drive loop in
//! process (the engine, the reconciler and the outputs, as `init`, `serve` and
//! `get` run them), then the binary's serve loop under failing watches, pool
//! republishes and bursts of changes.

use drafs_test_support as support;

use std::time::Duration;

use drafs::engine::{EngineError, PodRef};
use std::path::Path;
use std::sync::Arc;

use drafs::engine::drive::{DriveError, Feed, drive};
use drafs::engine::reconcile::{Input, Mode, Reconciler, Step};
use drafs::engine::source::ApiFeed;
use drafs::model::resolve::{Resolution, Selection};
use drafs::publish::events::Events;
use drafs::publish::files::AtomicDir;
use drafs::publish::metrics::Metrics;
use drafs::publish::outputs::{Outputs, TreeOutput, TreeWriters};
use serde_json::json;
use support::*;
use tokio::time::Instant;

async fn client(env: &Env) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Carry out each step's actions and feed the engine's inputs back until done;
/// every step is kept for the test to look at.
async fn run(
    engine: &mut ApiFeed,
    reconciler: &mut Reconciler,
    steps: &mut Vec<Step>,
) -> Result<Resolution, EngineError> {
    let mut step = reconciler.start(std::time::Instant::now());
    loop {
        engine.execute(std::mem::take(&mut step.actions));
        if let Some(done) = step.done.take() {
            steps.push(step);
            return done;
        }
        steps.push(step);
        let input = engine.next().await;
        step = reconciler.handle(std::time::Instant::now(), input);
    }
}

/// Run async test code on a runtime of its own (the test API server runs its own,
/// so it is started before this one).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

/// The watches the server was asked for, in order: "resource field-selector".
fn watch_requests(api: &TestApi) -> Vec<String> {
    api.requests()
        .iter()
        .filter(|r| r.verb == "watch")
        .map(|r| format!("{} {}", r.resource, r.field_selector))
        .collect()
}

fn pod_ref(ns: &str, name: &str) -> PodRef {
    PodRef { namespace: ns.into(), name: name.into() }
}

/// `devices` devices on each of `slices` node-local slices of one pool.
fn publish_node(api: &TestApi, slices: usize, devices: usize) {
    for s in 0..slices {
        let object =
            SliceBuilder::new(&format!("n1-s{s}"), "gpu.example.com", "n1").node("n1").slice_count(slices as i64);
        let object = (0..devices)
            .fold(object, |o, d| o.device(&format!("d{s}-{d}"), json!({"uuid": {"string": format!("U{s}-{d}")}})));
        api.apply(object.build());
    }
}

#[test]
fn paged_lists_keep_only_the_pods_devices_and_init_needs_no_watch() {
    let api = api_for("ml");
    publish_node(&api, 5, 4);
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&[("gpu", "gpu.example.com", "n1", "d3-2")])));
    let env = Env::new(&api, "ml", "p", TOKEN);

    block_on(async {
        let mut engine = ApiFeed::new(client(&env).await, pod_ref("ml", "p"), None).with_page_size(2);
        let mut reconciler = Reconciler::new(Mode::UntilReady, pod_ref("ml", "p"), Selection::default(), vec![]);
        let mut steps = Vec::new();
        let res = run(&mut engine, &mut reconciler, &mut steps).await.unwrap();
        let devices = &res.claims[0].devices;
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].device, "d3-2");
        let published = steps.iter().find_map(|s| s.publish.as_ref()).expect("published");
        assert_eq!(published.built.tree.get("gpu/gpu/0/uuid"), Some(&b"U3-2"[..]));

        let requests = api.requests();
        let slice_pages: Vec<_> = requests.iter().filter(|r| r.resource == "resourceslices").collect();
        assert_eq!(slice_pages.len(), 3, "5 slices in pages of 2: {slice_pages:?}");
        assert!(slice_pages.iter().all(|r| r.verb == "list" && r.query.contains("limit=2")));
        assert!(slice_pages[1..].iter().all(|r| r.query.contains("continue=")));
        assert!(requests.iter().all(|r| r.verb != "watch"), "ready from the first reads: no watch");
        let reads: Vec<_> = requests.iter().map(|r| format!("{} {}", r.verb, r.resource)).collect();
        assert_eq!(reads.iter().filter(|r| *r == "get pods").count(), 1);
        assert_eq!(reads.iter().filter(|r| *r == "list resourceclaims").count(), 1);
    })
}

#[test]
fn serve_follows_with_one_watch_per_scope() {
    let (api, env) = example("hpc", "allreduce-worker-3", "examples/offline/rdma-network.yaml");

    block_on(async {
        let mut engine = ApiFeed::new(client(&env).await, pod_ref("hpc", "allreduce-worker-3"), None);
        let mut reconciler =
            Reconciler::new(Mode::Follow, pod_ref("hpc", "allreduce-worker-3"), Selection::default(), vec![]);
        let mut step = reconciler.start(std::time::Instant::now());
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut changed = false;
        loop {
            engine.execute(std::mem::take(&mut step.actions));
            if let Some(p) = &step.publish {
                let name = p.built.tree.get("nics/rdma/0/ifName").map(|v| String::from_utf8_lossy(v).into_owned());
                if name.as_deref() == Some("ens9") {
                    break;
                }
            }
            let watching = reconciler.watching().count();
            if !changed && watching == 3 {
                // The claim, the node's slices and the pod are followed: change the NIC's slice.
                let mut s = api.get("ResourceSlice", "", "node-rdma-02-dra.net-7fk2l").unwrap();
                s["spec"]["devices"][1]["attributes"]["dra.net/ifName"] = json!({"string": "ens9"});
                api.apply(s);
                changed = true;
            }
            assert!(Instant::now() < deadline, "the change did not arrive");
            step = tokio::time::timeout(Duration::from_secs(30), async {
                reconciler.handle(std::time::Instant::now(), engine.next().await)
            })
            .await
            .unwrap();
        }
        let watches = || {
            let mut watches = watch_requests(&api);
            watches.sort();
            watches
        };
        // Each watch is a request its own task sends: the slice's change can
        // arrive before the pod's watch has reached the server.
        let deadline = Instant::now() + Duration::from_secs(30);
        while watches().len() < 3 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            watches(),
            [
                "pods metadata.name=allreduce-worker-3",
                "resourceclaims metadata.name=allreduce-worker-3-nics-q8w4t",
                "resourceslices spec.nodeName=node-rdma-02"
            ],
            "one watch per scope"
        );
        // The pod is watched from the version it was fetched at: no list of pods.
        assert!(api.requests().iter().all(|r| !(r.verb == "list" && r.resource == "pods")));
    })
}

#[test]
fn a_stalled_server_cannot_hold_a_run_past_its_deadline() {
    let (api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    api.set_latency(Duration::from_secs(3600));

    block_on(async {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(500);
        let mut engine = ApiFeed::new(client(&env).await, pod_ref("ml", "trainer-0"), Some(deadline));
        let mut reconciler =
            Reconciler::new(Mode::UntilReady, pod_ref("ml", "trainer-0"), Selection::default(), vec![]);
        let result =
            tokio::time::timeout(Duration::from_secs(20), run(&mut engine, &mut reconciler, &mut Vec::new())).await;
        let Ok(Err(EngineError::Timeout { waiting_for })) = result else { panic!("{result:?}") };
        assert!(waiting_for[0].contains("pod ml/trainer-0 not fetched yet"), "{waiting_for:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    })
}

#[test]
fn a_silent_watch_is_restarted() {
    let (api, env) = example("hpc", "allreduce-worker-3", "examples/offline/rdma-network.yaml");
    // No bookmarks and no changes: the watches stay silent.
    api.set_bookmark_interval(Duration::from_secs(3600));

    block_on(async {
        let mut engine = ApiFeed::new(client(&env).await, pod_ref("hpc", "allreduce-worker-3"), None)
            .with_watch_idle(Duration::from_millis(300));
        let mut reconciler =
            Reconciler::new(Mode::Follow, pod_ref("hpc", "allreduce-worker-3"), Selection::default(), vec![]);
        let mut step = reconciler.start(std::time::Instant::now());
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut restarts = Vec::new();
        // Until a silent watch was given up and watched again (from the version
        // it had reached: nothing was lost, so no list).
        let watches = || api.requests().iter().filter(|r| r.verb == "watch").count();
        while restarts.is_empty() || watches() < 3 {
            engine.execute(std::mem::take(&mut step.actions));
            assert!(Instant::now() < deadline, "no restart of a silent watch: {restarts:?}");
            let input = tokio::time::timeout(Duration::from_secs(30), engine.next()).await.unwrap();
            if let Input::Failed { error, .. } = &input {
                restarts.push(error.to_string());
            }
            step = reconciler.handle(std::time::Instant::now(), input);
        }
        assert!(restarts.iter().all(|r| r.contains("silent for 300 ms")), "{restarts:?}");
        assert_eq!(api.requests().iter().filter(|r| r.verb == "list").count(), 2, "no relist");
    })
}

// The drive loop in process.

/// A run of pod ml/p as `init` (`UntilReady`) or `serve` (`Follow`) wires it:
/// files written into `dir`, counted into `metrics`, no Events.
struct Run {
    metrics: Arc<Metrics>,
    outputs: Outputs,
    engine: ApiFeed,
    reconciler: Reconciler,
}

impl Run {
    async fn new(env: &Env, dir: &Path, mode: Mode, deadline: Option<Instant>) -> Run {
        let metrics = Arc::new(Metrics::default());
        let publisher = TreeWriters::new(TreeOutput::Files(AtomicDir::open(dir).unwrap()), None);
        let outputs = Outputs::new(publisher, metrics.clone(), Events::none(), dir);
        let engine = ApiFeed::new(client(env).await, pod_ref("ml", "p"), deadline);
        let reconciler = Reconciler::new(mode, pod_ref("ml", "p"), Selection::default(), vec![]);
        Run { metrics, outputs, engine, reconciler }
    }

    async fn drive(&mut self, fail_on_output_error: bool) -> Result<Resolution, DriveError> {
        drive(&mut self.engine, &mut self.reconciler, Some(&mut self.outputs), fail_on_output_error).await
    }

    /// Drive a following run until `reader` is done (a test failure if the run ends first).
    async fn follow_until(&mut self, reader: impl std::future::Future<Output = ()>) {
        tokio::select! {
            result = self.drive(false) => panic!("a following run ended: {:?}", result.err()),
            () = reader => {}
        }
    }
}

/// Pod ml/p whose claim `gpu` (ResourceClaim c) is not allocated.
fn unallocated(api: &TestApi) {
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", None));
}

/// A file of the tree at `dir`, as a reader sees it.
fn file(dir: &Path, rel: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(rel)).ok()
}

/// Until the file `rel` under `dir` reads `want` (a test failure after 30 s).
async fn until_file(dir: &Path, rel: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while file(dir, rel).as_deref() != Some(want) {
        assert!(Instant::now() < deadline, "{rel} is {:?}, not {want:?}", file(dir, rel));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn metric(metrics: &Metrics, name: &str) -> u64 {
    let text = metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn drive_until_ready_writes_the_tree_before_it_returns() {
    let api = api_for("ml");
    one_gpu(&api);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let dir = env.path("dra");

    block_on(async {
        let mut run = Run::new(&env, &dir, Mode::UntilReady, None).await;
        let res = run.drive(true).await.unwrap();
        let metrics = &run.metrics;
        assert!(res.is_complete());
        // Written (not merely submitted) when drive returns: an init container may exit.
        assert_eq!(file(&dir, "gpu/gpu/0/uuid").as_deref(), Some("U0"));
        assert!(dir.join(".ready").exists());
        assert!(metrics.is_ready());
        assert_eq!(metric(metrics, "drafs_tree_updates_total"), 1);
    })
}

#[test]
fn drive_follows_a_live_update_to_the_bytes_a_reader_sees() {
    let api = api_for("ml");
    one_gpu(&api);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let dir = env.path("dra");

    block_on(async {
        let mut run = Run::new(&env, &dir, Mode::Follow, None).await;
        let metrics = run.metrics.clone();
        let reader = async {
            until_file(&dir, "gpu/gpu/0/uuid", "U0").await;
            set_uuid(&api, "U1");
            until_file(&dir, "gpu/gpu/0/uuid", "U1").await;
            // Counted once the write is done, just after the reader could see it.
            while metric(&metrics, "drafs_tree_updates_total") < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        run.follow_until(reader).await;
        assert!(dir.join(".ready").exists(), "still ready");
        assert_eq!(metric(&metrics, "drafs_tree_updates_total"), 2);
        let watches = api.requests().iter().filter(|r| r.verb == "watch").count();
        assert!(watches >= 1, "the update came by a watch");
    })
}

#[test]
fn drive_coalesces_a_burst_into_few_writes() {
    const CHANGES: usize = 300;
    let api = api_for("ml");
    eight_device_pod(&api);
    eight_device_slice(&api, 0);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let dir = env.path("dra");

    block_on(async {
        let mut run = Run::new(&env, &dir, Mode::Follow, None).await;
        let metrics = run.metrics.clone();
        let mut before = 0;
        let burst = async {
            until_file(&dir, "gpu/gpu/0/attr0", "value-0-0-0").await;
            before = metric(&metrics, "drafs_tree_updates_total");
            for generation in 1..=CHANGES {
                eight_device_slice(&api, generation);
            }
            until_file(&dir, "gpu/gpu/7/attr29", &format!("value-7-29-{CHANGES}")).await;
        };
        run.follow_until(burst).await;
        let writes = metric(&metrics, "drafs_tree_updates_total") - before;
        assert!(writes <= (CHANGES / 10) as u64, "{writes} tree writes for {CHANGES} changes");
    })
}

#[test]
fn resolve_once_says_what_is_missing_without_waiting() {
    let api = api_for("ml");
    unallocated(&api);
    let env = Env::new(&api, "ml", "p", TOKEN);

    block_on(async {
        let started = Instant::now();
        // As `get` and `exec` resolve: once, publishing nothing.
        let deadline = Some(tokio::time::Instant::now() + Duration::from_secs(60));
        let mut engine = ApiFeed::new(client(&env).await, pod_ref("ml", "p"), deadline);
        let mut reconciler = Reconciler::new(Mode::Once, pod_ref("ml", "p"), Selection::default(), vec![]);
        let res = drive(&mut engine, &mut reconciler, None, true).await.unwrap();
        assert!(!res.is_complete());
        assert!(!res.missing.is_empty());
        assert!(started.elapsed() < Duration::from_secs(10), "did not wait for the allocation");
        assert!(api.requests().iter().all(|r| r.verb != "watch"), "nothing followed");
    })
}

#[test]
fn drive_past_its_deadline_fails_with_what_is_missing_and_writes_nothing() {
    let api = api_for("ml");
    unallocated(&api);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let dir = env.path("dra");

    block_on(async {
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut run = Run::new(&env, &dir, Mode::UntilReady, Some(deadline)).await;
        let result = tokio::time::timeout(Duration::from_secs(20), run.drive(true)).await.unwrap();
        let Err(DriveError::Engine(EngineError::Timeout { waiting_for })) = result else {
            panic!("{:?}", result.err())
        };
        assert!(!waiting_for.is_empty());
        assert!(!dir.join(".ready").exists(), "not ready");
        assert!(!run.metrics.is_ready());
    })
}

// The binary's serve loop.

const LIMIT: Duration = Duration::from_secs(60);
/// What the backoff tests watch: the requests in the first 10 s after ready.
const WINDOW: Duration = Duration::from_secs(10);
/// The most requests (get, list, watch) `serve` may make in [`WINDOW`] while
/// every watch fails (issue 16: 117 to 326 before the backoff).
const MOST_IN_WINDOW: usize = 10;
/// The longest retry delay (docs/operations.md): a healed server is used again within it.
const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// Pod ml/p whose claim `gpu` (ResourceClaim c) holds g0 of node n1's slice.
fn one_gpu(api: &TestApi) {
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&[("gpu", "gpu.example.com", "n1", "g0")])));
    set_uuid(api, "U0");
}

fn set_uuid(api: &TestApi, uuid: &str) {
    api.apply(slice("n1", "gpu.example.com", "n1", 1, Some("n1"), &[("g0", json!({"uuid": {"string": uuid}}))]));
}

/// `serve --backend files` until ready, then the reads (get, list, watch) it
/// makes in the [`WINDOW`] after: the count is the behaviour under test, so
/// the test fails as soon as it is over [`MOST_IN_WINDOW`].
fn reads_in_window_after_ready(api: &TestApi, env: &Env) -> (Serve, Vec<String>) {
    let dir = env.path("dra");
    let serve = Serve::start_ready(env, &dir, &["--backend", "files"], LIMIT);
    let ready = std::time::Instant::now();
    let reads = || -> Vec<String> {
        api.requests()
            .iter()
            .filter(|r| r.started >= ready && r.started < ready + WINDOW)
            .filter(|r| matches!(r.verb.as_str(), "get" | "list" | "watch"))
            .map(|r| {
                format!(
                    "{:>5} ms {} {} ({}) -> {}",
                    (r.started - ready).as_millis(),
                    r.verb,
                    r.resource,
                    r.field_selector,
                    r.status
                )
            })
            .collect()
    };
    while ready.elapsed() < WINDOW {
        let seen = reads();
        assert!(
            seen.len() <= MOST_IN_WINDOW,
            "{} requests within {} ms of ready:\n{}",
            seen.len(),
            ready.elapsed().as_millis(),
            seen.join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen = reads();
    eprintln!("{} requests in {WINDOW:?} after ready:\n{}", seen.len(), seen.join("\n"));
    assert!(seen.len() <= MOST_IN_WINDOW, "{} requests in {WINDOW:?} after ready:\n{}", seen.len(), seen.join("\n"));
    assert!(seen.iter().any(|r| r.contains("watch")), "the watches were tried: {seen:?}");
    (serve, seen)
}

#[test]
fn a_watch_the_rbac_does_not_grant_is_retried_with_backoff() {
    // The shipped RBAC without `watch`: lists succeed, every watch is 403.
    let api = TestApi::start(&rbac_yaml("ml").replace("  - watch\n", ""), "ml");
    api.add_token(TOKEN, "system:serviceaccount:ml:drafs");
    one_gpu(&api);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let (serve, seen) = reads_in_window_after_ready(&api, &env);
    assert!(seen.iter().any(|r| r.contains("watch") && r.ends_with("403")), "{seen:?}");
    assert_eq!(serve.read(".ready").as_deref(), Some(""), "the listed tree is served meanwhile");
}

#[test]
fn watches_answering_410_relist_with_backoff() {
    let api = api_for("ml");
    one_gpu(&api);
    api.set_watch_fault(WatchFault::Gone);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let (serve, seen) = reads_in_window_after_ready(&api, &env);
    assert!(seen.iter().filter(|r| r.contains(" list ")).count() >= 1, "410 relists: {seen:?}");
    assert_eq!(serve.read("gpu/gpu/0/uuid").as_deref(), Some("U0"));
}

#[test]
fn watches_closed_at_once_are_resumed_with_backoff() {
    let api = api_for("ml");
    one_gpu(&api);
    api.set_watch_fault(WatchFault::CloseAtOnce);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let (serve, seen) = reads_in_window_after_ready(&api, &env);
    // Counted from the run's start, not from ready: a test thread that saw
    // `.ready` late would miss the first resumes in its window.
    let watches = watch_requests(&api);
    let scopes: std::collections::BTreeSet<&String> = watches.iter().collect();
    assert!(watches.len() - scopes.len() >= 3, "closed watches are resumed: {watches:?}, after ready: {seen:?}");
    assert_eq!(serve.read("gpu/gpu/0/uuid").as_deref(), Some("U0"));
}

#[test]
fn failing_watches_back_off_and_recover_within_the_cap_once_healed() {
    let api = api_for("ml");
    one_gpu(&api);
    // 500, not 503: the kube client retries 503/429/504 by itself before reporting.
    api.inject(Fault { verb: Some("watch".into()), resource: None, status: 500, count: usize::MAX });
    let env = Env::new(&api, "ml", "p", TOKEN);
    let (mut serve, seen) = reads_in_window_after_ready(&api, &env);
    assert!(seen.iter().any(|r| r.ends_with("500")), "{seen:?}");
    // Healed: the change shows up once the next retry, at most the cap away, succeeds.
    api.clear_faults();
    set_uuid(&api, "U1");
    serve.wait_for("gpu/gpu/0/uuid", Some("U1"), BACKOFF_CAP + Duration::from_secs(5));
}

/// A pool of two slices (n1-a holds g0, n1-b holds g1, `resourceSliceCount: 2`)
/// at `generation`, each device with `version` = `gen<generation>`.
fn pool_slice(api: &TestApi, name: &str, device: &str, generation: i64) {
    let s = SliceBuilder::new(name, "gpu.example.com", "n1").generation(generation).slice_count(2).node("n1");
    api.apply(s.device(device, json!({"version": {"string": format!("gen{generation}")}})).build());
}

/// A one-slice pool `mark` whose device m0 carries `value`: once the tree shows
/// it, drafs has handled every slice event sent before it (one watch, in order).
fn marker(api: &TestApi, value: &str) {
    api.apply(slice("n1-mark", "gpu.example.com", "mark", 1, Some("n1"), &[("m0", json!({"v": {"string": value}}))]));
}

#[test]
fn a_pool_republished_slice_by_slice_keeps_serving_its_last_complete_generation() {
    let api = api_for("ml");
    let results = [
        ("gpu", "gpu.example.com", "n1", "g0"),
        ("gpu", "gpu.example.com", "n1", "g1"),
        ("mark", "gpu.example.com", "mark", "m0"),
    ];
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&results)));
    pool_slice(&api, "n1-a", "g0", 1);
    pool_slice(&api, "n1-b", "g1", 1);
    marker(&api, "before");
    let env = Env::new(&api, "ml", "p", TOKEN);
    let dir = env.path("dra");
    let dir_arg = dir.to_str().unwrap().to_string();
    let mut serve = Serve::start_ready(&env, &dir, &["--backend", "files"], LIMIT);
    let consistent = |serve: &Serve, want: &str| {
        assert_eq!(serve.read(".ready").as_deref(), Some(""), ".ready stays");
        for device in ["0", "1"] {
            assert_eq!(serve.read(&format!("gpu/gpu/{device}/version")).as_deref(), Some(want), "device {device}");
        }
    };

    // The driver republishes the pool at generation 2, one slice at a time.
    pool_slice(&api, "n1-a", "g0", 2);
    marker(&api, "after-a");
    serve.wait_for("gpu/mark/0/v", Some("after-a"), LIMIT);
    // Until n1-b follows, generation 2 is incomplete: generation 1 is still the pool.
    let window = std::time::Instant::now();
    let mut polls = 0;
    while window.elapsed() < Duration::from_secs(1) {
        consistent(&serve, "gen1");
        polls += 1;
        if polls == 1 {
            let probe = env.run(&["probe", "--dir", &dir_arg], LIMIT);
            assert!(probe.status.success(), "probe during the republish: {}", stderr(&probe));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(polls > 50, "polled {polls} times");
    pool_slice(&api, "n1-b", "g1", 2);
    serve.wait_for("gpu/gpu/1/version", Some("gen2"), LIMIT);
    consistent(&serve, "gen2");
    let lost: Vec<_> = api.events().into_iter().filter(|e| e["type"] == "Warning").collect();
    assert!(lost.is_empty(), "no Warning: {lost:?}");
}

fn tree_updates(addr: &str) -> u64 {
    let (_, body) = http_get(addr, "/metrics").expect("metrics answer");
    body.lines()
        .find_map(|l| l.strip_prefix("drafs_tree_updates_total ")?.parse().ok())
        .expect("drafs_tree_updates_total")
}

#[test]
fn a_burst_of_changes_is_coalesced_into_few_writes() {
    const CHANGES: usize = 1000;
    let api = api_for("ml");
    eight_device_pod(&api);
    eight_device_slice(&api, 0);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let addr = format!("127.0.0.1:{}", free_port());
    let dir = env.path("dra");
    let mut serve = Serve::start_ready(&env, &dir, &["--backend", "files", "--metrics-addr", &addr], LIMIT);
    let before = tree_updates(&addr);
    let start = std::time::Instant::now();
    for generation in 1..=CHANGES {
        eight_device_slice(&api, generation);
    }
    let burst = start.elapsed();
    serve.wait_for("gpu/gpu/0/attr0", Some(&format!("value-0-0-{CHANGES}")), LIMIT);
    eprintln!("burst {} ms, last value {} ms after", burst.as_millis(), (start.elapsed() - burst).as_millis());
    assert_eq!(serve.read("gpu/gpu/7/attr29").as_deref(), Some(&*format!("value-7-29-{CHANGES}")));
    let writes = tree_updates(&addr) - before;
    eprintln!("{writes} tree writes for {CHANGES} changes");
    assert!(writes <= (CHANGES / 10) as u64, "{writes} tree writes for {CHANGES} changes");
}
