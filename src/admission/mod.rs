//! Admission: adding drafs to workloads, before they run.
//!
//! Owns, by concern:
//! - which pods get drafs, and with which options (`policy`, pure: the
//!   `drafs.dev/inject` label, the webhook's paths, the annotations);
//! - the manifest rewrite shared by `drafs inject` and the webhook (`inject`,
//!   pure; the drafs container's requests and limits: `resources`) and the
//!   RBAC drafs needs (`manifests`);
//! - the answer to one AdmissionReview (`decision`, pure), which reads only
//!   the parts of the pod `inject` needs (`prune`) and answers with a JSON
//!   Patch computed against the raw text (`patch`);
//! - the HTTPS server around it (`webhook`: certificates in `webhook::tls`,
//!   connection slots, requests, metrics; a panic contained to its review:
//!   `contain`), and what a certificate chain says (`x509`, pure);
//! - whether all of it works for a namespace or a pod (`check`, pure, one
//!   file per check; `cmd/check.rs` reads the objects, and reaches the
//!   webhook with `probe`).
//!
//! May use: `publish` (the metrics endpoint, the Prometheus text) and `model`.

pub mod check;
pub mod contain;
pub mod decision;
pub mod inject;
pub mod manifests;
pub mod patch;
pub mod policy;
pub mod probe;
pub mod prune;
pub mod resources;
pub mod webhook;
pub mod x509;
