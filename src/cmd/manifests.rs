//! `drafs manifests rbac`: the RBAC drafs needs in one namespace, on stdout,
//! standalone or as one RoleBinding of the shared role, or the shared roles.

use std::io::Write;

use crate::admission::manifests::{self, SlicesReaders};
use crate::cmd::Failure;
use crate::cmd::cli::RbacArgs;

#[derive(Debug)]
pub enum Config {
    /// A namespace's own Role, ClusterRole and bindings (`events`: and the events Role).
    Standalone { namespace: String, service_account: String, events: bool },
    /// A namespace's RoleBinding of the shared `cluster_role`.
    Tenant { namespace: String, service_account: String, cluster_role: String },
    /// The cluster-scoped objects every namespace shares.
    SharedRoles(SlicesReaders),
}

impl Config {
    pub fn from_args(args: &RbacArgs) -> Self {
        let service_account = args.service_account.clone();
        match (&args.namespace, &args.cluster_role) {
            (None, _) if args.slices_for.is_empty() => Config::SharedRoles(SlicesReaders::AllServiceAccounts),
            (None, _) => Config::SharedRoles(SlicesReaders::Namespaces(args.slices_for.clone())),
            (Some(namespace), Some(role)) => {
                Config::Tenant { namespace: namespace.clone(), service_account, cluster_role: role.clone() }
            }
            (Some(namespace), None) => {
                Config::Standalone { namespace: namespace.clone(), service_account, events: args.events }
            }
        }
    }
}

pub fn run(c: &Config) -> Result<(), Failure> {
    let docs = match c {
        Config::Standalone { namespace, service_account, events } => {
            manifests::rbac(namespace, service_account, *events)
        }
        Config::Tenant { namespace, service_account, cluster_role } => {
            manifests::tenant_binding(namespace, service_account, cluster_role)
        }
        Config::SharedRoles(readers) => manifests::shared_roles("drafs", readers),
    };
    let text = manifests::to_yaml(&docs).map_err(|e| Failure::Failed(format!("cannot write YAML: {e}")))?;
    std::io::stdout().write_all(text.as_bytes()).map_err(|e| Failure::Failed(format!("cannot write stdout: {e}")))
}
