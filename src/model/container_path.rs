//! Where drafs may mount its files in a container (pure): the rules the
//! webhook, `drafs inject`, the CLI and the NRI door apply alike.

/// The service-account token's directory in a container.
pub const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Why a path cannot be a container mount path for drafs's files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathProblem {
    #[error("must be an absolute path such as /dra")]
    NotAbsolute,
    #[error("must not be / itself")]
    Root,
    #[error("must be a clean path (no '.', '..' or empty parts, no spaces, control characters or ':')")]
    NotClean,
    #[error("is longer than 1024 bytes")]
    TooLong,
    #[error("is where the service-account token is mounted (/var/run is /run in most images)")]
    TokenPath,
    #[error("is {0} or below it, which the kernel or the container runtime provides")]
    SystemPath(&'static str),
    #[error("overlaps the tree's directory {0}")]
    OverlapsTree(String),
}

/// Whether `path` can hold drafs's files in every container: absolute, clean,
/// and not the token's directory.
pub fn check_container_path(path: &str) -> Result<(), PathProblem> {
    let trimmed = path.trim_end_matches('/');
    if !path.starts_with('/') {
        return Err(PathProblem::NotAbsolute);
    }
    if trimmed.is_empty() {
        return Err(PathProblem::Root);
    }
    if path.len() > 1024 {
        return Err(PathProblem::TooLong);
    }
    let clean = trimmed[1..].split('/').all(|part| {
        !part.is_empty() && part != "." && part != ".." && part.chars().all(|c| c.is_ascii_graphic() && c != ':')
    });
    if !clean {
        return Err(PathProblem::NotClean);
    }
    // /var/run is a link to /run in most images: the same directory by another name.
    let aliases = [
        trimmed.to_string(),
        match trimmed.strip_prefix("/run") {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("/var/run{rest}"),
            _ => trimmed.to_string(),
        },
    ];
    for path in &aliases {
        if within(TOKEN_PATH, path) || within(path, TOKEN_PATH) {
            return Err(PathProblem::TokenPath);
        }
    }
    for system in SYSTEM_PATHS {
        if within(trimmed, system) {
            return Err(PathProblem::SystemPath(system));
        }
    }
    Ok(())
}

/// Directories a mount must not hide: the kernel's (`/proc`, `/sys`), the
/// runtime's device nodes and the files the kubelet writes (`/dev`, `/etc`:
/// hosts, resolv.conf, hostname).
const SYSTEM_PATHS: [&str; 4] = ["/proc", "/sys", "/dev", "/etc"];

/// Whether `inner` is `outer` or below it.
fn within(inner: &str, outer: &str) -> bool {
    let (inner, outer) = (inner.trim_end_matches('/'), outer.trim_end_matches('/'));
    inner == outer || inner.strip_prefix(outer).is_some_and(|rest| rest.starts_with('/'))
}

/// Check the metadata directory against the tree's: neither may hold the other.
pub fn check_metadata_dir(metadata_dir: &str, dir: &str) -> Result<(), PathProblem> {
    check_container_path(metadata_dir)?;
    if within(metadata_dir, dir) || within(dir, metadata_dir) {
        return Err(PathProblem::OverlapsTree(dir.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_checked_against_aliases_and_system_directories() {
        for (path, problem) in [
            ("/var/run", PathProblem::TokenPath),
            ("/run/secrets/kubernetes.io/serviceaccount", PathProblem::TokenPath),
            ("/run/secrets", PathProblem::TokenPath),
            ("/run", PathProblem::TokenPath),
            ("/proc/dra", PathProblem::SystemPath("/proc")),
            ("/dev", PathProblem::SystemPath("/dev")),
            ("/etc/dra/", PathProblem::SystemPath("/etc")),
            ("/sys/fs/dra", PathProblem::SystemPath("/sys")),
        ] {
            assert_eq!(check_container_path(path), Err(problem), "{path}");
        }
        for fine in
            ["/dra", "/run/dra", "/var/run/kubernetes.io/dra-device-attributes", "/etcetera", "/devices", "/runner"]
        {
            assert_eq!(check_container_path(fine), Ok(()), "{fine}");
        }
    }
}
