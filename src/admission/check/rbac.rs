//! The RBAC check: may the service account drafs runs as do what drafs
//! needs (the permissions `drafs manifests rbac` grants)?

use serde_json::json;

use super::{Check, Status};
use crate::admission::manifests::Grant;

/// What grants `account` drafs's RBAC: one RoleBinding of the chart's
/// `shared_role` where the cluster has it, else the namespace's own objects.
pub fn grant_command(namespace: &str, account: &str, shared_role: Option<&str>) -> String {
    match shared_role {
        Some(role) => format!("drafs manifests rbac -n {namespace} --service-account {account} --cluster-role {role}"),
        None => format!("drafs manifests rbac -n {namespace} --service-account {account}"),
    }
}

/// The RBAC check: `answers` pairs each permission with whether a
/// SubjectAccessReview allowed it; `Err` says why they could not be asked.
/// `shared_role`: the chart's tenant ClusterRole, when the cluster has it.
pub fn rbac(
    namespace: &str,
    account: &str,
    answers: Result<Vec<(Grant, bool)>, String>,
    shared_role: Option<&str>,
) -> Check {
    let fix_base = grant_command(namespace, account, shared_role);
    let answers = match answers {
        Ok(a) => a,
        Err(why) => {
            return Check::new(
                "rbac",
                Status::Warn,
                format!("cannot tell whether service account {namespace}/{account} has drafs's permissions: {why}"),
                json!({"serviceAccount": account, "known": false, "missing": [], "optionalMissing": []}),
            )
            .with_fix(format!(
                "ask someone who may create subjectaccessreviews, or apply: {fix_base} | kubectl apply -f -"
            ));
        }
    };
    let missing = missing_required(&answers);
    let optional: Vec<String> =
        answers.iter().filter(|(g, ok)| !ok && g.optional).map(|(g, _)| g.to_string()).collect();
    let details = json!({"serviceAccount": account, "known": true, "missing": missing, "optionalMissing": optional,
               "checked": answers.iter().map(|(g, _)| g.to_string()).collect::<Vec<_>>()});
    if !missing.is_empty() {
        return Check::new(
            "rbac",
            Status::Fail,
            format!("service account {namespace}/{account} may not {}", missing.join(", ")),
            details,
        )
        .with_fix(format!("{fix_base} | kubectl apply -f -"));
    }
    if !optional.is_empty() {
        let mut lost = Vec::new();
        if optional.iter().any(|g| g.contains("events")) {
            lost.push("drafs's Events do not show in kubectl describe pod");
        }
        if optional.iter().any(|g| g.starts_with("watch pods")) {
            lost.push("a sidecar's device health does not follow the pod's status");
        }
        return Check::new(
            "rbac",
            Status::Warn,
            format!(
                "service account {namespace}/{account} has every permission drafs needs, but may not {}: {}",
                optional.join(", "),
                lost.join("; ")
            ),
            details,
        )
        .with_fix(format!("{} --events | kubectl apply -f -", grant_command(namespace, account, None)));
    }
    Check::new(
        "rbac",
        Status::Ok,
        format!("service account {namespace}/{account} has every permission drafs needs ({} checked)", answers.len()),
        details,
    )
}

/// The permissions drafs needs (not the optional ones) that the answers refused.
pub(super) fn missing_required(answers: &[(Grant, bool)]) -> Vec<String> {
    answers.iter().filter(|(g, ok)| !ok && !g.optional).map(|(g, _)| g.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rbac_names_the_missing_verb_and_the_fix() {
        let grants = crate::admission::manifests::grants("ml", "trainer");
        let all = |except: &str| grants.iter().map(|g| (g.clone(), g.to_string() != except)).collect::<Vec<_>>();
        let c = rbac("ml", "trainer", Ok(all("")), None);
        assert_eq!(c.status, Status::Ok);
        let c = rbac("ml", "trainer", Ok(all("list resourceslices.resource.k8s.io (cluster-wide)")), None);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(c.message, "service account ml/trainer may not list resourceslices.resource.k8s.io (cluster-wide)");
        assert_eq!(c.fix.unwrap(), "drafs manifests rbac -n ml --service-account trainer | kubectl apply -f -");
        let c = rbac("ml", "trainer", Ok(all("create events in ml")), None);
        assert_eq!(c.status, Status::Warn);
        assert!(c.fix.unwrap().contains("--events"));
        let c = rbac("ml", "trainer", Err("HTTP 403".into()), None);
        assert_eq!(c.status, Status::Warn);
        assert_eq!(c.details["known"], false);
        // Where the chart's shared role is there, one RoleBinding of it; events stay a standalone Role.
        let c = rbac("ml", "trainer", Ok(all("get pods in ml")), Some("drafs-tenant"));
        let fix =
            "drafs manifests rbac -n ml --service-account trainer --cluster-role drafs-tenant | kubectl apply -f -";
        assert_eq!(c.fix.unwrap(), fix);
        let c = rbac("ml", "trainer", Ok(all("create events in ml")), Some("drafs-tenant"));
        assert_eq!(
            c.fix.unwrap(),
            "drafs manifests rbac -n ml --service-account trainer --events | kubectl apply -f -"
        );
    }
}
