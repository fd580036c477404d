//! Environment variables from the tree, for apps that only read env
//! (`drafs exec`, KEP-5304's first design).
//!
//! `NAME=CLAIM/REQUEST/INDEX/ATTR` takes one device's value;
//! `NAME=CLAIM/REQUEST/ATTR` (no index) joins the values of all devices of the
//! request with `,`, in allocation order. An extended resource's devices are
//! named the same way with the resource as the claim and the container as
//! the request: `GPU=nvidia.com/gpu/trainer/0/uuid` (a claim name never has a
//! dot, so a first component with one starts a resource name).

use crate::model::extended::is_servable_resource;
use crate::model::names::is_dns_label;
use crate::model::tree::{Tree, is_clean_relative};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error(
        "--env {0:?}: expected NAME=CLAIM/REQUEST/INDEX/ATTRIBUTE or NAME=CLAIM/REQUEST/ATTRIBUTE (for an extended resource, CLAIM is DOMAIN/RESOURCE and REQUEST the container)"
    )]
    Syntax(String),
    #[error("--env {0:?}: {1:?} is not a valid variable name")]
    BadName(String, String),
    #[error("{name}: no value at {path} (use --optional to leave it unset)")]
    Missing { name: String, path: String },
}

/// One `--env` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSpec {
    pub name: String,
    pub claim: String,
    pub request: String,
    /// None: every device of the request.
    pub index: Option<usize>,
    pub attribute: String,
}

impl std::str::FromStr for EnvSpec {
    type Err = EnvError;
    fn from_str(s: &str) -> Result<Self, EnvError> {
        let (name, path) = s.split_once('=').ok_or_else(|| EnvError::Syntax(s.into()))?;
        let valid_name = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(EnvError::BadName(s.into(), name.into()));
        }
        let path = path.trim_matches('/');
        if !is_clean_relative(path) {
            return Err(EnvError::Syntax(s.into()));
        }
        // The claim: a pod claim (a DNS label), or an extended resource's DOMAIN/NAME.
        let (claim, rest) = match path.split_once('/') {
            Some((first, rest)) if first.contains('.') => match rest.split_once('/') {
                Some((resource, rest)) if is_servable_resource(&format!("{first}/{resource}")) => {
                    (format!("{first}/{resource}"), rest)
                }
                _ => return Err(EnvError::Syntax(s.into())),
            },
            Some((first, rest)) if is_dns_label(first) => (first.to_string(), rest),
            _ => return Err(EnvError::Syntax(s.into())),
        };
        let parts: Vec<&str> = rest.splitn(2, '/').collect();
        if parts.len() < 2 || !is_dns_label(parts[0]) {
            return Err(EnvError::Syntax(s.into()));
        }
        let (index, attribute) = match parts[1].split_once('/') {
            Some((first, rest)) if first.parse::<usize>().is_ok() => (first.parse().ok(), rest.to_string()),
            _ => (None, parts[1].to_string()),
        };
        if attribute.is_empty() || attribute.parse::<usize>().is_ok() {
            return Err(EnvError::Syntax(s.into()));
        }
        Ok(EnvSpec { name: name.into(), claim, request: parts[0].into(), index, attribute })
    }
}

/// Where values are read from: a tree in memory or one written to a directory.
pub trait ValueSource {
    fn value(&self, rel: &str) -> Option<String>;
    /// The device indices present under `claim/request`, ascending.
    fn indices(&self, claim: &str, request: &str) -> Vec<usize>;
}

impl ValueSource for Tree {
    fn value(&self, rel: &str) -> Option<String> {
        self.get(rel).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    fn indices(&self, claim: &str, request: &str) -> Vec<usize> {
        let prefix = format!("{claim}/{request}/");
        let mut out: Vec<usize> = self
            .files()
            .filter_map(|(p, _)| p.strip_prefix(&prefix))
            .filter_map(|rest| rest.split('/').next()?.parse().ok())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// The variables to set; a missing value is an error unless `optional`.
pub fn values(specs: &[EnvSpec], source: &dyn ValueSource, optional: bool) -> Result<Vec<(String, String)>, EnvError> {
    let mut out = Vec::new();
    for spec in specs {
        let base = format!("{}/{}", spec.claim, spec.request);
        let value = match spec.index {
            Some(i) => source.value(&format!("{base}/{i}/{}", spec.attribute)),
            None => {
                let indices = source.indices(&spec.claim, &spec.request);
                let all: Option<Vec<String>> =
                    indices.iter().map(|i| source.value(&format!("{base}/{i}/{}", spec.attribute))).collect();
                all.filter(|v| !v.is_empty()).map(|v| v.join(","))
            }
        };
        match value {
            Some(v) => out.push((spec.name.clone(), v)),
            None if optional => {}
            None => {
                let path = match spec.index {
                    Some(i) => format!("{base}/{i}/{}", spec.attribute),
                    None => format!("{base}/*/{}", spec.attribute),
                };
                return Err(EnvError::Missing { name: spec.name.clone(), path });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> Tree {
        Tree::from_pairs(&[
            ("nics/rdma/0/.status/interfaceName", "net1"),
            ("nics/rdma/1/.status/interfaceName", "net2"),
            ("nics/rdma/0/dra.net/mtu", "9000"),
            ("nics/rdma/1/dra.net/mtu", "1500"),
            ("nics/rdma/1/only", "x"),
        ])
    }

    #[test]
    fn parses_both_forms() {
        let s: EnvSpec = "IF=nics/rdma/0/.status/interfaceName".parse().unwrap();
        assert_eq!((s.index, s.attribute.as_str()), (Some(0), ".status/interfaceName"));
        let s: EnvSpec = "MTU=nics/rdma/dra.net/mtu".parse().unwrap();
        assert_eq!((s.index, s.attribute.as_str()), (None, "dra.net/mtu"));
        let s: EnvSpec = "GPU=nvidia.com/gpu/trainer/0/uuid".parse().unwrap();
        assert_eq!(
            (s.claim.as_str(), s.request.as_str(), s.index, s.attribute.as_str()),
            ("nvidia.com/gpu", "trainer", Some(0), "uuid")
        );
        let s: EnvSpec = "ALL=nvidia.com/gpu/trainer/gpu.nvidia.com/uuid".parse().unwrap();
        assert_eq!((s.claim.as_str(), s.index, s.attribute.as_str()), ("nvidia.com/gpu", None, "gpu.nvidia.com/uuid"));
        for bad in [
            "IF",
            "1X=a/b/0/c",
            "X=a/b",
            "X=a/../0/c",
            "X=a/b/0",
            "X=A/b/0/c",
            "X=nvidia.com/../trainer/0/uuid",
            "X=nvidia.com/gpu/Trainer/0/uuid",
        ] {
            assert!(bad.parse::<EnvSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn values_single_all_and_missing() {
        let specs: Vec<EnvSpec> = ["A=nics/rdma/1/dra.net/mtu", "ALL=nics/rdma/.status/interfaceName"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let got = values(&specs, &tree(), false).unwrap();
        assert_eq!(got, vec![("A".into(), "1500".into()), ("ALL".into(), "net1,net2".into())]);

        let partial: EnvSpec = "P=nics/rdma/only".parse().unwrap();
        let err = values(std::slice::from_ref(&partial), &tree(), false).unwrap_err();
        assert_eq!(err, EnvError::Missing { name: "P".into(), path: "nics/rdma/*/only".into() });
        assert!(values(&[partial], &tree(), true).unwrap().is_empty());
    }
}
