//! Any request body the webhook could be sent: never a panic; a review it
//! answers is an AdmissionReview for the same uid, and a patch it returns
//! applies to the pod it was given.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok((answer, verdict)) = drafs::admission::review(data, "drafs:fuzz") else { return };
    let request: Value = serde_json::from_slice(data).expect("a reviewed body is JSON");
    assert_eq!(answer["response"]["uid"], request["request"]["uid"]);
    if let drafs::admission::Verdict::Patched { patch, .. } = verdict {
        let spec = request["request"]["object"]["spec"].as_object().expect("a patched pod has a spec object");
        for op in patch {
            let key = op["path"].as_str().and_then(|p| p.strip_prefix("/spec/")).expect("patches touch the spec");
            assert_eq!(op["op"] == "add", !spec.contains_key(&key.replace("~1", "/").replace("~0", "~")));
        }
    }
});
