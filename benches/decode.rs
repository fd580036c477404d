//! The decode and resolve path in-process, without a server or a child
//! process: what one list page and one resolution cost the CPU.
//!
//! Run: `cargo bench --bench decode`. Three rows, each the median of 15
//! rounds, in the thread's CPU time (a busy machine's other work does not
//! count):
//!
//! - a page of 4 slices x 128 devices x 30 string attributes (the scale
//!   bench's shape), decoded with a filter that keeps 2 of its devices, as
//!   `engine/source.rs` decodes a list page;
//! - a page of 64 ResourceClaims, each with 4 devices whose driver wrote
//!   `status.devices[].data` (MIG-like members, a few numbers), decoded one by
//!   one as `engine/source.rs` does;
//! - one resolution and tree of a pod with 8 such devices (the resolver walks
//!   every device's data into member files each time it runs).

use std::hint::black_box;

use drafs::model::objects::FileObjects;
use drafs::model::resolve::{Selection, resolve};
use drafs::model::slices::{self, DeviceFilter, RawList};
use drafs::model::tree;
use serde_json::{Value, json};

const ROUNDS: usize = 15;

fn data(i: usize) -> Value {
    json!({
        "uuid": format!("MIG-5c8a2f1e-7b3d-5e9a-8c4f-{i:012x}"),
        "profile": "1g.10gb",
        "gpu": {"index": i % 8, "uuid": format!("GPU-2b1a0f9e-8d7c-4b6a-9f5e-{i:012x}"), "pciBusID": "0000:4e:00.0"},
        "placement": {"start": 3, "size": 1},
        "gpuInstanceID": 13, "computeInstanceID": 0,
        "deviceNodes": ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap120", "/dev/nvidia-caps/nvidia-cap121"],
        "memoryBytes": 10737418240u64, "ratio": 0.125,
    })
}

fn slice_page() -> String {
    let items: Vec<Value> = (0..4)
        .map(|s| {
            let devices: Vec<Value> = (0..128)
                .map(|d| {
                    let attrs: serde_json::Map<String, Value> = (0..30)
                        .map(|a| (format!("attr{a}"), json!({"string": format!("value-{s}-{d}-{a}-0123456789abcdef")})))
                        .collect();
                    json!({"name": format!("dev-{s}-{d}"), "attributes": attrs})
                })
                .collect();
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": format!("n1-slice-{s}"), "resourceVersion": "7"},
                "spec": {"driver": "cpu.example.com", "nodeName": "n1",
                    "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 4}, "devices": devices}})
        })
        .collect();
    json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {"resourceVersion": "9"}, "items": items})
        .to_string()
}

fn claim(name: &str, devices: usize) -> Value {
    let results: Vec<Value> = (0..devices)
        .map(|d| json!({"request": "mig", "driver": "gpu.nvidia.com", "pool": "n1", "device": format!("mig-{d}")}))
        .collect();
    let statuses: Vec<Value> = (0..devices)
        .map(|d| json!({"driver": "gpu.nvidia.com", "pool": "n1", "device": format!("mig-{d}"), "data": data(d)}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"), "resourceVersion": "5", "generation": 1},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "count": devices}}]}},
        "status": {"allocation": {"devices": {"results": results}}, "devices": statuses}})
}

fn claim_page() -> String {
    let items: Vec<Value> = (0..64).map(|c| claim(&format!("c{c}"), 4)).collect();
    json!({"kind": "ResourceClaimList", "apiVersion": "resource.k8s.io/v1", "metadata": {"resourceVersion": "9"}, "items": items})
        .to_string()
}

fn pod_file() -> String {
    let devices: Vec<Value> =
        (0..8).map(|d| json!({"name": format!("mig-{d}"), "attributes": {"type": {"string": "mig"}}})).collect();
    let docs = json!({"kind": "List", "items": [
        {"kind": "Pod", "metadata": {"name": "p", "namespace": "ml", "uid": "u"},
         "spec": {"nodeName": "n1", "resourceClaims": [{"name": "mig", "resourceClaimName": "c"}]}},
        claim("c", 8),
        {"kind": "ResourceSlice", "metadata": {"name": "s"},
         "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}, "devices": devices}},
    ]});
    docs.to_string()
}

/// The CPU time this thread has used, in seconds.
fn cpu_time() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime");
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Median CPU time of one call over [`ROUNDS`] rounds of `per_round` calls.
fn time(per_round: usize, mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let started = cpu_time();
            for _ in 0..per_round {
                f();
            }
            (cpu_time() - started) / per_round as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

fn main() {
    let slices_text = slice_page();
    let filter = DeviceFilter::new([
        ("cpu.example.com".into(), "n1".into(), "dev-0-37".into()),
        ("cpu.example.com".into(), "n1".into(), "dev-3-74".into()),
    ]);
    let slices = time(20, || {
        let page: RawList = serde_json::from_str(black_box(&slices_text)).unwrap();
        for raw in page.items {
            black_box(slices::decode(raw.get(), &filter, Some("n1")).unwrap());
        }
    });

    let claims_text = claim_page();
    let claims = time(50, || {
        let page: RawList = serde_json::from_str(black_box(&claims_text)).unwrap();
        for raw in page.items {
            black_box(slices::decode_claim(raw.get()).unwrap());
        }
    });

    let snapshot = FileObjects::parse("bench", &pod_file()).unwrap().into_snapshot("bench", None).unwrap();
    let resolution = time(500, || {
        let res = resolve(black_box(&snapshot), &Selection::default());
        assert_eq!(res.claims[0].devices.len(), 8);
        black_box(tree::build(&res, &[]));
    });

    println!("| what (median of {ROUNDS} rounds) | bytes | CPU time |");
    println!("|---|---|---|");
    println!(
        "| decode a page of 4 slices x 128 devices x 30 attributes, keep 2 | {} | {:.2} ms |",
        slices_text.len(),
        slices * 1e3
    );
    println!(
        "| decode a page of 64 claims x 4 devices with status data | {} | {:.1} µs |",
        claims_text.len(),
        claims * 1e6
    );
    println!("| resolve and lay out 8 devices with status data | - | {:.1} µs |", resolution * 1e6);
}
