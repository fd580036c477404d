//! What drafs's NRI plugin costs the runtime and the API server
//! (docs/nri.md), in-process: the runtime's end of the socket as
//! tests/nri.rs plays it (NRI's multiplexer and ttrpc over a Unix socket),
//! the agent's door against drafs's test API server, the mounts recorded.
//!
//!   - CreateContainer round trips, from the runtime's side of the socket:
//!     a container of a pod not opted in (every other container of the node
//!     passes through the plugin: the goal is under 1 ms), a container of an
//!     opted-in pod that uses no device, and one given its ready tree;
//!   - the API requests of a served pod's life (bound, sandbox run, three
//!     containers created, sandbox removed), by verb and resource, per pod.
//!
//! Run: `cargo bench --bench nri` (a few seconds). Prints two Markdown tables.

#[path = "../tests/nri_harness/mod.rs"]
mod nri_harness;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use drafs::node::nri::api;
use nri_harness::*;
use serde_json::json;

const CALLS: usize = 2000;
const PODS: usize = 20;

/// Median, 99th percentile and maximum, in microseconds.
fn spread(mut times: Vec<Duration>) -> (f64, f64, f64) {
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(times[times.len() / 2]), us(times[times.len() * 99 / 100]), us(times[times.len() - 1]))
}

fn round_trips(agent: &mut Agent, pod: &api::PodSandbox, container: &str, served: bool) -> Vec<Duration> {
    (0..CALLS)
        .map(|_| {
            let started = Instant::now();
            let answer = rt().block_on(agent.runtime.create_container(pod, container, vec![])).unwrap();
            let took = started.elapsed();
            assert_eq!(answer.adjust.is_some(), served, "{container}: {answer:?}");
            took
        })
        .collect()
}

fn sandbox_call(agent: &mut Agent, method: &str, pod: &api::PodSandbox) {
    let request = api::PodSandboxRequest { pod: Some(pod.clone()) };
    rt().block_on(agent.runtime.call(method, &request, Duration::from_secs(2))).unwrap();
}

fn main() {
    let api = api();
    gpus(&api, "");
    let pod = gpu_pod(&api, "p", "u1", json!({}));
    let mut agent = agent_with(api, vec![], None);
    agent.wait_ready("u1", "trainer");
    let elsewhere = sandbox("other", "u-other", false);
    println!("| CreateContainer of | median (µs) | p99 (µs) | max (µs) |\n|---|---|---|---|");
    let rows: [(&str, &api::PodSandbox, &str, bool); 3] = [
        ("a container of a pod not opted in", &elsewhere, "app", false),
        ("an opted-in pod's container that uses no device", &pod, "logger", false),
        ("an opted-in pod's container, given its ready tree", &pod, "trainer", true),
    ];
    for (what, pod, container, served) in rows {
        round_trips(&mut agent, pod, container, served); // warm-up
        let (median, p99, max) = spread(round_trips(&mut agent, pod, container, served));
        println!("| {what} | {median:.0} | {p99:.0} | {max:.0} |");
    }

    // A served pod's life, PODS times: what it asks the API server.
    agent.api.clear_requests();
    for n in 0..PODS {
        let uid = format!("life-{n}");
        let pod = gpu_pod(&agent.api, &format!("life-{n}"), &uid, json!({}));
        agent.wait_ready(&uid, "trainer");
        sandbox_call(&mut agent, "RunPodSandbox", &pod);
        for container in ["trainer", "server", "logger"] {
            rt().block_on(agent.runtime.create_container(&pod, container, vec![])).unwrap();
        }
        sandbox_call(&mut agent, "RemovePodSandbox", &pod);
    }
    // The last pod's reads after its sandbox ran are asynchronous: let them
    // land (a bench's pause; the figures are counts).
    std::thread::sleep(Duration::from_millis(500));
    let mut by: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in agent.api.requests() {
        *by.entry((r.verb.clone(), r.resource.clone())).or_default() += 1;
    }
    println!("\n| request | per pod |\n|---|---|");
    for ((verb, resource), n) in by {
        println!("| {verb} {resource} | {:.2} |", n as f64 / PODS as f64);
    }
}
