//! Admission: adding drafs to workloads, before they run.
//!
//! Owns: the decision for one AdmissionReview (`decision`, pure), the
//! manifest rewrite it shares with `drafs inject` (`inject`, pure), the HTTPS
//! server around the decision (`webhook`, which contains a panic to the review
//! that caused it: `contain`), the RBAC drafs needs
//! (`manifests`), and whether all of it works for a namespace or a pod
//! (`check`, pure: `cmd/check.rs` reads the objects).
//!
//! May use: `publish` (the metrics endpoint) and `model`.

pub mod check;
pub mod contain;
pub mod decision;
pub mod inject;
pub mod manifests;
pub mod patch;
pub mod policy;
pub mod probe;
pub mod prune;
pub mod webhook;
pub mod x509;
