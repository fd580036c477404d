//! The other source: the pod, its claims and slices from a file (`--from-file`),
//! resolved once; the file does not change, so nothing is waited for.

use std::path::Path;

use tracing::{info, warn};

use crate::model::objects::{FileObjects, LoadError};
use crate::model::resolve::{Missing, Resolution, Selection, resolve};

/// Resolve the pod of the file at `path` (`-`: standard input).
pub fn resolve_file(path: &Path, pod_name: Option<&str>, sel: &Selection) -> Result<Resolution, LoadError> {
    let objects = FileObjects::read(path)?;
    if !objects.ignored.is_empty() {
        info!(kinds = ?objects.ignored, "ignoring objects of other kinds in {}", path.display());
    }
    let shown = if path == Path::new("-") { "standard input".to_string() } else { path.display().to_string() };
    let snapshot = objects.into_snapshot(&shown, pod_name)?;
    let mut res = resolve(&snapshot, sel);
    for w in &res.warnings {
        warn!("{w}");
    }
    // A claim the file does not hold is not "not found" in a cluster: say
    // where it is missing and how to add it.
    let namespace = res.pod.namespace.clone();
    for missing in &mut res.missing {
        if let Missing::ClaimNotFound { pod_claim, claim_name } = missing {
            *missing = Missing::Invalid {
                what: format!("claim {pod_claim}"),
                problem: format!(
                    "ResourceClaim {claim_name} is not in {shown} (add it: kubectl get resourceclaim -n {namespace} {claim_name} -o yaml)"
                ),
            };
        }
    }
    Ok(res)
}
