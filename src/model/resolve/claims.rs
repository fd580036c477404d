//! The pod's claims to resolve: each pod claim with the ResourceClaim it
//! names (its own, a template's generated one, or the extended resources'),
//! as far as the pod's spec and status tell.

use k8s_openapi::api::core::v1::Pod;

use super::{ClaimOrigin, Selection};
use crate::model::extended::{self, ExtendedClaim};

/// Names of the ResourceClaim objects the pod uses, as far as its status tells.
pub fn claim_names(pod: &Pod, selection: &Selection) -> Vec<String> {
    let generated = extended::of_pod(pod, &mut Vec::new()).and_then(Result::ok);
    let mut names: Vec<String> = pod_claims(pod, selection, generated.as_ref())
        .into_iter()
        .filter_map(|c| match c.source {
            ClaimSource::Named(name) => Some(name),
            _ => None,
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Whether the pod asks for any device: a claim in its spec, or extended
/// resources that the scheduler backed with a claim (in its status).
pub fn has_claims(pod: &Pod) -> bool {
    let generated = extended::of_pod(pod, &mut Vec::new()).and_then(Result::ok);
    !pod_claims(pod, &Selection::default(), generated.as_ref()).is_empty()
}

pub(super) enum ClaimSource {
    Named(String),
    NotNeeded,
    Pending { template: String },
    Invalid(String),
}

/// A claim the tree has a directory for: a pod claim, or one extended resource.
pub(super) struct PodClaim {
    pub(super) name: String,
    pub(super) origin: ClaimOrigin,
    pub(super) source: ClaimSource,
    /// For an extended resource: each container that asked for it (its tree
    /// directory) and the claim's requests that hold its devices, in order.
    pub(super) requests: Option<Vec<(String, Vec<String>)>>,
}

/// The pod's claims and extended resources (restricted by the selection),
/// each with where its object is; `generated` is the pod's claim for its
/// extended resources, as `extended::of_pod` read it.
pub(super) fn pod_claims(pod: &Pod, selection: &Selection, generated: Option<&ExtendedClaim>) -> Vec<PodClaim> {
    let spec_claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
    let selected = |name: &str| selection.claims.is_empty() || selection.claims.iter().any(|c| c == name);
    let mut claims: Vec<PodClaim> = spec_claims
        .into_iter()
        .flatten()
        .filter(|c| selected(&c.name))
        .map(|c| {
            let origin = if c.resource_claim_name.is_none() { ClaimOrigin::Template } else { ClaimOrigin::Named };
            let source = match (&c.resource_claim_name, &c.resource_claim_template_name) {
                (Some(name), None) => ClaimSource::Named(name.clone()),
                (None, Some(template)) => match statuses.into_iter().flatten().find(|s| s.name == c.name) {
                    None => ClaimSource::Pending { template: template.clone() },
                    Some(status) => match &status.resource_claim_name {
                        Some(name) => ClaimSource::Named(name.clone()),
                        None => ClaimSource::NotNeeded,
                    },
                },
                _ => ClaimSource::Invalid(
                    "exactly one of resourceClaimName and resourceClaimTemplateName must be set".into(),
                ),
            };
            PodClaim { name: c.name.clone(), origin, source, requests: None }
        })
        .collect();
    let Some(generated) = generated else { return claims };
    for resource in generated.resources() {
        if !selected(resource) {
            continue;
        }
        let mut requests: Vec<(String, Vec<String>)> = Vec::new();
        for r in generated.requests.iter().filter(|r| r.resource == resource) {
            match requests.iter_mut().find(|(container, _)| *container == r.container) {
                Some((_, list)) => list.push(r.request.clone()),
                None => requests.push((r.container.clone(), vec![r.request.clone()])),
            }
        }
        claims.push(PodClaim {
            name: resource.to_string(),
            origin: ClaimOrigin::ExtendedResource,
            source: ClaimSource::Named(generated.claim_name.clone()),
            requests: Some(requests),
        });
    }
    claims
}
