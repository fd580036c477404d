//! Admission: adding drafs to workloads, before they run.
//!
//! Owns: the decision for one AdmissionReview (`decision`, pure), the
//! manifest rewrite it shares with `drafs inject` (`inject`, pure), the HTTPS
//! server around the decision (`webhook`), and the RBAC drafs needs
//! (`manifests`).
//!
//! May use: `publish` (the metrics endpoint) and `model`.

pub mod decision;
pub mod inject;
pub mod manifests;
pub mod webhook;
