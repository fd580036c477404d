//! Any request body the webhook could be sent: never a panic; a review it
//! answers is an AdmissionReview for the same uid, and a patch it returns
//! applies to the pod it was given and makes of it what `drafs inject` makes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok((answer, verdict)) = drafs::admission::review(data, "drafs:fuzz") else { return };
    let request: Value = serde_json::from_slice(data).expect("a reviewed body is JSON");
    assert_eq!(answer["response"]["uid"], request["request"]["uid"]);
    if let drafs::admission::Verdict::Patched { patch, .. } = verdict {
        let patch: Vec<Value> = serde_json::from_str(&patch).expect("the patch is a JSON array");
        let pod = &request["request"]["object"];
        assert!(patch.iter().all(|op| op["path"].as_str().is_some_and(|p| p.starts_with("/spec/"))));
        let mut patched = pod.clone();
        drafs::admission::apply_patch(&mut patched, &patch).expect("the patch applies to the pod");
        // The webhook's options come from the pod; inject on the whole pod with them.
        let mut whole = pod.clone();
        whole["kind"] = "Pod".into();
        let mut injected = whole.clone();
        let opts = drafs::admission::options_of(&whole, "drafs:fuzz").expect("a patched pod has valid options");
        drafs::inject::inject_value(&mut injected, &opts, &mut Vec::new()).expect("inject accepts a patched pod");
        patched["kind"] = "Pod".into();
        assert_eq!(patched, injected);
    }
});
