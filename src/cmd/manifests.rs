//! `drafs manifests rbac`: the RBAC drafs needs in one namespace, on stdout.

use std::io::Write;

use crate::admission::manifests;
use crate::cmd::Failure;
use crate::cmd::cli::RbacArgs;

#[derive(Debug)]
pub struct Config {
    pub namespace: String,
    pub service_account: String,
    pub events: bool,
}

impl Config {
    pub fn from_args(args: &RbacArgs) -> Self {
        Config { namespace: args.namespace.clone(), service_account: args.service_account.clone(), events: args.events }
    }
}

pub fn run(c: &Config) -> Result<(), Failure> {
    let docs = manifests::rbac(&c.namespace, &c.service_account, c.events);
    let text = manifests::to_yaml(&docs).map_err(|e| Failure::Failed(format!("cannot write YAML: {e}")))?;
    std::io::stdout().write_all(text.as_bytes()).map_err(|e| Failure::Failed(format!("cannot write stdout: {e}")))
}
