//! `drafs node --nri`'s door without a runtime: a test plays containerd on
//! the plugin's socket (NRI's multiplexer and ttrpc, written here from the
//! protocol, not from drafs's own wire), against drafs's test API server,
//! with the mounts recorded instead of made. What the real runtime does with
//! the answers is tests/realnode_nri.rs's; here, what a real node makes slow
//! to reach: a slow API server, a value that never comes, a restart.

mod nri_harness;

use std::time::{Duration, Instant};

use serde_json::json;

use drafs::node::nri::api;
use drafs_test_support::wait_for;
use nri_harness::*;

#[test]
fn each_device_using_container_of_an_opted_in_pod_gets_its_own_tree_and_no_other_container_anything() {
    let api = api();
    gpus(&api, "");
    let pod = gpu_pod(&api, "p", "u1", json!({}));
    let mut a = agent_with(api, vec![], None);
    // Made as soon as the node's pod watch sees the pod: before its sandbox runs.
    a.wait_ready("u1", "trainer");
    rt().block_on(async {
        a.runtime
            .call("RunPodSandbox", &api::PodSandboxRequest { pod: Some(pod.clone()) }, Duration::from_secs(2))
            .await
            .unwrap();
        let trainer = a.runtime.create_container(&pod, "trainer", vec![]).await.expect("answered");
        let mounts = trainer.adjust.expect("adjusted").mounts;
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        assert_eq!(mounts[0].destination, "/dra");
        assert_eq!(mounts[0].source, a.tree_of("u1", "trainer").to_string_lossy());
        assert!(mounts[0].options.contains(&"ro".to_string()) && mounts[0].r#type == "bind", "{mounts:?}");
        let server = a.runtime.create_container(&pod, "server", vec![]).await.expect("answered");
        assert_eq!(server.adjust.unwrap().mounts[0].source, a.tree_of("u1", "server").to_string_lossy());
        let logger = a.runtime.create_container(&pod, "logger", vec![]).await.expect("answered");
        assert_eq!(logger.adjust, None, "a container that uses no device gets nothing");
        // A pod that did not opt in: answered at once, with nothing.
        let started = Instant::now();
        let other = a.runtime.create_container(&sandbox("q", "u2", false), "app", vec![]).await.expect("answered");
        assert_eq!(other.adjust, None);
        assert!(started.elapsed() < Duration::from_millis(200), "{:?}", started.elapsed());
    });
    // Each sees its own request's device only.
    assert_eq!(read(&a.tree_of("u1", "trainer").join("gpus/train/0/uuid")).as_deref(), Some("G0"));
    assert!(!a.tree_of("u1", "trainer").join("gpus/infer").exists(), "the trainer sees no other request");
    assert_eq!(read(&a.tree_of("u1", "server").join("gpus/infer/0/uuid")).as_deref(), Some("G1"));
    assert!(!a.tree_of("u1", "server").join("gpus/train").exists());
    // Live: a slice change reaches each container's tree.
    gpus(&a.api, "'");
    let live = wait_for(Duration::from_secs(10), || {
        read(&a.tree_of("u1", "trainer").join("gpus/train/0/uuid")).as_deref() == Some("G0'")
    });
    assert!(live, "the container's tree does not follow the slice");
    // The sandbox goes: so does the pod's tree.
    let target = a.nri_dir().join("u1");
    assert!(a.mounts.0.lock().unwrap().contains(&target));
    rt().block_on(a.runtime.call(
        "RemovePodSandbox",
        &api::PodSandboxRequest { pod: Some(pod) },
        Duration::from_secs(2),
    ))
    .unwrap();
    assert!(!a.mounts.0.lock().unwrap().contains(&target), "unmounted");
    assert!(!target.exists(), "removed");
}

#[test]
fn a_container_whose_required_value_is_not_there_waits_told_why_before_the_runtimes_deadline() {
    let api = api();
    gpus(&api, "");
    let pod = gpu_pod(&api, "p", "u1", json!({"drafs.dev/require": "gpus/train/0/.status/interfaceName"}));
    let mut a = agent_with(api, vec![], None);
    // Its tree is written (not ready) as soon as the node's pod watch sees the pod.
    let written = wait_for(Duration::from_secs(10), || a.tree_of("u1", "trainer").join("..data/.json").exists());
    assert!(written, "the pod's trees are not written before its containers are created");
    let started = Instant::now();
    let refused = rt().block_on(a.runtime.create_container(&pod, "trainer", vec![])).unwrap_err();
    let took = started.elapsed();
    assert_eq!(refused.0, 14, "Unavailable: {refused:?}");
    assert!(refused.1.contains("required path gpus/train/0/.status/interfaceName does not exist"), "{}", refused.1);
    assert!(took < Duration::from_millis(1750), "answered {took:?} after the call, the runtime gives 2 s");
    // Not the server's: it does not use the train request.
    rt().block_on(a.runtime.create_container(&pod, "server", vec![])).expect("the server is not held up");
    // The driver writes it (at prepare): the kubelet's next try finds it.
    let mut claim = a.api.get("ResourceClaim", "ml", "p-gpus").unwrap();
    claim["status"]["devices"] =
        json!([{"driver": "gpu.example.com", "pool": NODE, "device": "g0", "networkData": {"interfaceName": "net1"}}]);
    a.api.apply(claim);
    let served = wait_for(Duration::from_secs(10), || {
        rt().block_on(a.runtime.create_container(&pod, "trainer", vec![])).is_ok()
    });
    assert!(served, "served once the value is there");
    let got = read(&a.tree_of("u1", "trainer").join("gpus/train/0/.status/interfaceName"));
    if got.is_none() {
        let listing = std::process::Command::new("ls").arg("-laR").arg(a.tree_of("u1", "trainer")).output().unwrap();
        eprintln!("{}", String::from_utf8_lossy(&listing.stdout));
        eprintln!("{:?}", read(&a.tree_of("u1", "trainer").join(".json")));
    }
    assert_eq!(got.as_deref(), Some("net1"));
}

#[test]
fn a_namespace_whose_containers_never_get_ready_spends_its_share_of_the_runtime_not_the_nodes() {
    let api = api();
    gpus(&api, "");
    let never = json!({"drafs.dev/require": "gpus/train/0/.status/interfaceName"});
    let pods: Vec<_> = (0..6).map(|n| gpu_pod(&api, &format!("p{n}"), &format!("u{n}"), never.clone())).collect();
    let neighbour = gpu_pod_in(&api, "lab", "q", "v1", never.clone());
    let mut a = agent_with(api, vec![], None);
    for (n, _) in pods.iter().enumerate() {
        let written =
            wait_for(Duration::from_secs(10), || a.tree_of(&format!("u{n}"), "trainer").join("..data/.json").exists());
        assert!(written, "pod p{n}'s trees are not written");
    }
    // Each creation waits for its tree (the runtime holds every other
    // creation of the node meanwhile) until the namespace's share is spent.
    let mut waits = Vec::new();
    for pod in &pods {
        let started = Instant::now();
        let refused = rt().block_on(a.runtime.create_container(pod, "trainer", vec![])).unwrap_err();
        assert_eq!(refused.0, 14, "Unavailable: {refused:?}");
        waits.push((started.elapsed(), refused.1));
    }
    // The fifth waits what the namespace's bucket refilled meanwhile (a
    // little: it refills in a minute), and says so.
    for (_, said) in &waits[4..] {
        let waited = said.split("(waited ").nth(1).and_then(|rest| rest.split(' ').next());
        let waited: u64 = waited.and_then(|ms| ms.parse().ok()).unwrap_or_else(|| panic!("{waits:?}"));
        assert!(waited < 400, "waited {waited} ms of 500: {waits:?}");
        assert!(said.contains("namespace ml has spent its share"), "{waits:?}");
    }
    let full: Duration = waits[..4].iter().map(|(took, _)| *took).sum();
    assert!(full >= Duration::from_millis(1800), "the first four waited for their trees: {waits:?}");
    // Another namespace's creation still waits its whole time.
    let started = Instant::now();
    let refused = rt().block_on(a.runtime.create_container(&neighbour, "trainer", vec![])).unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(450), "lab's creation waited {:?}", started.elapsed());
    assert!(!refused.1.contains("share"), "{}", refused.1);
    // A tree that is ready is served whatever the share.
    let mut claim = a.api.get("ResourceClaim", "ml", "p5-gpus").unwrap();
    claim["status"]["devices"] =
        json!([{"driver": "gpu.example.com", "pool": NODE, "device": "g0", "networkData": {"interfaceName": "net1"}}]);
    a.api.apply(claim);
    a.wait_ready("u5", "trainer");
    rt().block_on(a.runtime.create_container(&pods[5], "trainer", vec![])).expect("served with its share spent");
}

#[test]
fn a_slow_api_server_cannot_hold_a_containers_creation_past_the_runtimes_deadline() {
    let api = api();
    gpus(&api, "");
    let mut a = agent_with(api, vec![], None);
    // Made after the agent joined, with every answer of the API server late.
    a.api.set_latency(Duration::from_secs(5));
    let pod = gpu_pod(&a.api, "p", "u1", json!({}));
    let started = Instant::now();
    let refused = rt().block_on(a.runtime.create_container(&pod, "trainer", vec![])).unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(1750), "answered {:?} after the call", started.elapsed());
    assert_eq!(refused.0, 14, "{refused:?}");
    // Healed: served at a later try.
    a.api.set_latency(Duration::ZERO);
    let served = wait_for(Duration::from_secs(20), || {
        rt().block_on(a.runtime.create_container(&pod, "trainer", vec![])).is_ok()
    });
    assert!(served, "served once the API server answers");
}

#[test]
fn a_drivers_own_standard_view_files_get_their_mount_points_and_are_never_written() {
    let api = api();
    gpus(&api, "");
    let standard = "/var/run/kubernetes.io/dra-device-attributes";
    let pod = gpu_pod(&api, "p", "u1", json!({"drafs.dev/metadata-dir": standard}));
    let mut a = agent_with(api, vec![], None);
    // The driver's own file, bound by the runtime (its CDI spec) below the standard path.
    a.wait_ready("u1", "trainer");
    let rel = "resourceclaims/p-gpus/train/gpu.example.com-metadata.json";
    let bind = api::Mount {
        destination: format!("{standard}/{rel}"),
        r#type: "bind".into(),
        source: "/var/run/cdi/x".into(),
        options: vec![],
    };
    let answer = rt().block_on(a.runtime.create_container(&pod, "trainer", vec![bind])).expect("answered");
    let mounts = answer.adjust.unwrap().mounts;
    let view = a.nri_dir().join("u1/trainer.metadata");
    assert_eq!(mounts.iter().map(|m| m.destination.as_str()).collect::<Vec<_>>(), ["/dra", standard]);
    assert_eq!(mounts[1].source, view.to_string_lossy());
    let placeholder = view.join(rel);
    assert!(placeholder.is_file(), "the driver's mount point is there");
    let before = read(&placeholder).unwrap();
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&placeholder).unwrap());
    // A change of the device: drafs's tree follows, the driver's file is left as it is.
    gpus(&a.api, "'");
    let live = wait_for(Duration::from_secs(10), || {
        read(&a.tree_of("u1", "trainer").join("gpus/train/0/uuid")).as_deref() == Some("G0'")
    });
    assert!(live);
    assert_eq!(read(&placeholder).unwrap(), before, "never written");
    assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&placeholder).unwrap()), inode, "never replaced");
}

#[test]
fn a_restarted_agent_takes_its_pods_trees_back_and_removes_those_of_pods_gone() {
    let api = api();
    gpus(&api, "");
    let pod = gpu_pod(&api, "p", "u1", json!({}));
    let mut a = agent_with(api, vec![], None);
    a.wait_ready("u1", "trainer");
    rt().block_on(a.runtime.create_container(&pod, "trainer", vec![])).expect("served");
    // A tree of a pod that went while the agent was away.
    let gone = a.nri_dir().join("u-gone");
    std::fs::create_dir_all(gone.join("app")).unwrap();
    a.mounts.0.lock().unwrap().insert(gone.clone());
    // The agent stops (its trees stay), and a new one starts: the runtime
    // synchronizes it with the pods it runs.
    let Agent { api, dir, mounts, served, tasks, runtime } = a;
    for task in tasks {
        task.abort();
    }
    rt().block_on(served.stop_all());
    drop(runtime);
    let b = agent_with(api, vec![pod.clone()], Some((dir, mounts)));
    assert!(!gone.exists() && !b.mounts.0.lock().unwrap().contains(&gone), "the gone pod's tree is removed");
    gpus(&b.api, "'");
    let live = wait_for(Duration::from_secs(10), || {
        read(&b.tree_of("u1", "trainer").join("gpus/train/0/uuid")).as_deref() == Some("G0'")
    });
    assert!(live, "the running pod's tree is live again");
}

#[test]
fn a_container_is_given_only_its_own_pods_tree_whatever_the_names_it_comes_with() {
    let api = api();
    gpus(&api, "");
    let one = gpu_pod(&api, "p1", "u1", json!({}));
    let two = gpu_pod(&api, "p2", "u2", json!({}));
    let mut a = agent_with(api, vec![], None);
    a.wait_ready("u1", "trainer");
    a.wait_ready("u2", "trainer");
    for (pod, uid) in [(&one, "u1"), (&two, "u2")] {
        let answer = rt().block_on(a.runtime.create_container(pod, "trainer", vec![])).unwrap();
        let source = answer.adjust.unwrap().mounts[0].source.clone();
        assert_eq!(source, a.tree_of(uid, "trainer").to_string_lossy());
    }
    // Names that would lead out of the pod's directory are refused, nothing mounted.
    let hostile = [
        (one.clone(), "../u2/trainer"),
        (one.clone(), ".."),
        (api::PodSandbox { uid: "../u2".into(), ..one.clone() }, "trainer"),
        (api::PodSandbox { uid: "u1/../u2".into(), ..one.clone() }, "trainer"),
    ];
    for (pod, container) in hostile {
        let refused = rt().block_on(a.runtime.create_container(&pod, container, vec![])).unwrap_err();
        assert_eq!(refused.0, 3, "InvalidArgument for {}/{container}: {refused:?}", pod.uid);
        assert!(refused.1.contains("drafs cannot serve"), "{}", refused.1);
    }
}
