//! What the kubelet (or anything that can reach the agent's sockets) sends
//! `drafs node`: any bytes as a CSI message, a publish checked against the
//! kubelet's directory, and any HTTP/2 header block through the
//! `:authority` fix. Never a panic; a publish accepted targets only the pod's
//! own volume directory; the fix is stable (fixing its output changes nothing).
#![no_main]

use std::path::{Component, Path};

use drafs::node::authority;
use drafs::node::proto::{self, NodePublishVolumeRequest, NodeUnpublishVolumeRequest, RegistrationStatus};
use drafs::node::request::{Publish, TokenIn};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = proto::check(data);
    let _ = NodeUnpublishVolumeRequest::decode(data);
    let _ = RegistrationStatus::decode(data);
    if let Ok(req) = NodePublishVolumeRequest::decode(data) {
        for token_in in [TokenIn::VolumeContext, TokenIn::Secrets] {
            let Ok(publish) = Publish::check(&req, Path::new("/var/lib/kubelet"), "drafs.dev", token_in) else {
                continue;
            };
            let pod_dir = Path::new("/var/lib/kubelet/pods").join(&publish.pod_uid);
            assert!(publish.target.starts_with(&pod_dir), "{publish:?}");
            assert!(publish.target.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_))));
            assert!(!publish.token.is_empty());
        }
    }
    if let Some(fixed) = authority::fix_block(data) {
        assert!(authority::fix_block(&fixed).is_none_or(|again| again == fixed), "the fix is not stable");
    }
    if let Some((&flags, payload)) = data.split_first() {
        let _ = authority::fix_headers_frame(flags, payload);
    }
});
