//! What a NodePublishVolume asks for, checked before anything is mounted: the
//! pod (from `podInfoOnMount`), its own service-account token (from the
//! CSIDriver's `tokenRequests`), the target directory (only a pod volume
//! directory of this node's kubelet), and the volume's options. Pure: every
//! refusal is an `InvalidArgument` whose message `kubectl describe pod` shows.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use crate::model::PodRef;
use crate::model::resolve::Selection;
use crate::model::tree::RequirePath;
use crate::node::proto::NodePublishVolumeRequest;

const POD_NAME: &str = "csi.storage.k8s.io/pod.name";
const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
const POD_UID: &str = "csi.storage.k8s.io/pod.uid";
const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
const TOKENS: &str = "csi.storage.k8s.io/serviceAccount.tokens";
/// What the kubelet adds besides these (read or not, never an unknown option).
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";

/// The volume attributes a pod may set (`volumeAttributes`).
pub const CLAIMS_OPTION: &str = "claims";
pub const REQUIRE_OPTION: &str = "require";
/// `tree` (the default) or `standard`: the KEP-5304 files instead of the tree.
pub const VIEW_OPTION: &str = "view";
/// With `view: standard`: drivers that write their own files (`--metadata-from-driver`).
pub const METADATA_FROM_DRIVERS_OPTION: &str = "metadataFromDrivers";

/// What a volume serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum View {
    /// The tree, `<claim>/<request>/<index>/<attribute>`.
    #[default]
    Tree,
    /// The standard (KEP-5304) view, `resourceclaims/<claim>/<request>/<driver>-metadata.json`,
    /// leaving the files of these drivers to them (the runtime mounts theirs there).
    Standard { from_drivers: Vec<String> },
}

impl View {
    /// The name a pod's volume attribute gives it.
    pub fn name(&self) -> &'static str {
        match self {
            View::Tree => "tree",
            View::Standard { .. } => "standard",
        }
    }
}

/// A publish, checked.
#[derive(Clone, PartialEq, Eq)]
pub struct Publish {
    pub volume_id: String,
    pub target: PathBuf,
    pub pod: PodRef,
    pub pod_uid: String,
    /// The pod's service-account token, audience the API server's.
    pub token: String,
    pub selection: Selection,
    pub require: Vec<RequirePath>,
    pub view: View,
    /// The SELinux context the kubelet asks every file of the volume to have
    /// (`context=` among the mount flags), given to the tmpfs: files the agent
    /// writes later carry it too, where a relabel by the runtime would reach
    /// only the first tree.
    pub selinux_context: Option<String>,
}

impl std::fmt::Debug for Publish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publish")
            .field("volume_id", &self.volume_id)
            .field("target", &self.target)
            .field("pod", &self.pod)
            .field("pod_uid", &self.pod_uid)
            .field("selection", &self.selection)
            .field("require", &self.require)
            .field("view", &self.view)
            .field("selinux_context", &self.selinux_context)
            .finish_non_exhaustive()
    }
}

/// Why a publish is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(
        "drafs serves CSI ephemeral inline volumes only (a `csi:` volume in the pod's spec), not persistent volumes"
    )]
    NotEphemeral,
    #[error("a drafs volume is a directory of files, not a block device")]
    Block,
    #[error("drafs volumes are read-only: set `readOnly: true` on the pod's csi volume")]
    Writable,
    #[error("the request does not say which pod ({0} is missing): the CSIDriver {1} needs `podInfoOnMount: true`")]
    NoPodInfo(&'static str, String),
    #[error(
        "the request carries no service-account token for the API server in its {1}: the CSIDriver {0} needs `tokenRequests: [{{audience: \"\"}}]`{hint}",
        hint = .1.hint()
    )]
    NoToken(String, TokenIn),
    #[error("the service-account tokens the kubelet sent are not valid JSON: {0}")]
    BadTokens(String),
    #[error("volume ids and pod names must be non-empty text without control characters or '/'")]
    BadName,
    #[error("the target {target} is not a pod volume directory of the kubelet at {kubelet_dir} for pod {uid}")]
    Target { target: String, kubelet_dir: String, uid: String },
    #[error(
        "unknown volume attribute {0:?}: drafs knows `claims` (claim names, comma-separated), `require` (tree paths, comma-separated), `view` (tree or standard) and `metadataFromDrivers` (driver names, comma-separated)"
    )]
    UnknownOption(String),
    #[error("volume attribute `view`: {0:?} is neither `tree` (the default) nor `standard` (the KEP-5304 files)")]
    View(String),
    #[error("volume attribute `metadataFromDrivers`: {0}")]
    FromDrivers(String),
    #[error("volume attribute `require`: {0}")]
    Require(String),
    #[error("volume attribute `require`: {}", crate::model::tree::TreeError::KnownAfterPrepare(.0.clone()))]
    RequirePrepared(String),
    #[error(
        "mount flag {0:?}: drafs honours only the kubelet's SELinux `context=\"USER:ROLE:TYPE[:LEVEL]\"` (once) on its volumes"
    )]
    MountFlag(String),
}

/// Where the kubelet puts the pod's token: the CSIDriver's
/// `serviceAccountTokenInSecrets` decides (KEP-5538, 1.35+), and the agent
/// is told the same (`drafs node --token-in`, which the chart sets from the
/// value it gives the CSIDriver). The other place is the tenant's to fill
/// (`volumeAttributes`, or the secrets of the pod's `nodePublishSecretRef`):
/// a token there is never used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TokenIn {
    /// The request's volume context (`serviceAccountTokenInSecrets` unset or false).
    #[default]
    VolumeContext,
    /// The request's secrets (`serviceAccountTokenInSecrets: true`).
    Secrets,
}

impl TokenIn {
    fn hint(self) -> &'static str {
        match self {
            TokenIn::VolumeContext => {
                " (drafs node --token-in=volume-context: the CSIDriver must not set serviceAccountTokenInSecrets)"
            }
            TokenIn::Secrets => {
                " and `serviceAccountTokenInSecrets: true` (drafs node --token-in=secrets; Kubernetes 1.35+)"
            }
        }
    }
}

impl std::fmt::Display for TokenIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TokenIn::VolumeContext => "volume context",
            TokenIn::Secrets => "secrets",
        })
    }
}

impl Publish {
    /// Check a publish for the kubelet whose root directory is `kubelet_dir`
    /// (the CSIDriver is `driver`, named in the messages, and puts the pod's
    /// token where `token_in` says).
    pub fn check(
        req: &NodePublishVolumeRequest,
        kubelet_dir: &Path,
        driver: &str,
        token_in: TokenIn,
    ) -> Result<Publish, RequestError> {
        let ctx = &req.volume_context;
        if ctx.get(EPHEMERAL).map(String::as_str) != Some("true") {
            return Err(RequestError::NotEphemeral);
        }
        if req.block {
            return Err(RequestError::Block);
        }
        if !req.readonly {
            return Err(RequestError::Writable);
        }
        let field = |key: &'static str| {
            ctx.get(key).filter(|v| !v.is_empty()).cloned().ok_or_else(|| RequestError::NoPodInfo(key, driver.into()))
        };
        let pod = PodRef { namespace: field(POD_NAMESPACE)?, name: field(POD_NAME)? };
        let pod_uid = field(POD_UID)?;
        for name in [&req.volume_id, &pod.namespace, &pod.name, &pod_uid] {
            if name.is_empty() || name.len() > 253 || name.chars().any(|c| c.is_control() || c == '/') {
                return Err(RequestError::BadName);
            }
        }
        let target = check_target(&req.target_path, kubelet_dir, &pod_uid)?;
        // Only where the kubelet puts it: what is in the other place, the tenant wrote.
        let tokens = match token_in {
            TokenIn::Secrets => req.secrets.get(TOKENS),
            TokenIn::VolumeContext => ctx.get(TOKENS),
        };
        let token = api_token(tokens.map(String::as_str), driver, token_in)?;
        let (selection, require, view) = options(ctx)?;
        let selinux_context = selinux_context(&req.mount_flags)?;
        Ok(Publish {
            volume_id: req.volume_id.clone(),
            target,
            pod,
            pod_uid,
            token,
            selection,
            require,
            view,
            selinux_context,
        })
    }
}

/// The label of the one `context="..."` mount flag, if any (quotes optional:
/// the kubelet quotes it, for the commas of its categories). Anything else is
/// refused: the label goes into the tmpfs's mount options, where a `,` or
/// `"` of its own would add options of the tenant's choosing.
fn selinux_context(flags: &[String]) -> Result<Option<String>, RequestError> {
    let mut context = None;
    for flag in flags {
        let label =
            flag.strip_prefix("context=").map(|l| l.strip_prefix('"').and_then(|l| l.strip_suffix('"')).unwrap_or(l));
        let label = label.filter(|l| {
            let parts: Vec<&str> = l.splitn(4, ':').collect();
            l.len() <= 255
                && parts.len() >= 3
                && parts.iter().all(|p| !p.is_empty())
                && l.chars().all(|c| c.is_ascii_alphanumeric() || "_.:,-".contains(c))
        });
        match (label, &context) {
            (Some(label), None) => context = Some(label.to_string()),
            _ => return Err(RequestError::MountFlag(flag.clone())),
        }
    }
    Ok(context)
}

/// The target must be a volume directory of the pod's own (see [`volume_dir_pod`]).
fn check_target(target: &str, kubelet_dir: &Path, uid: &str) -> Result<PathBuf, RequestError> {
    match volume_dir_pod(kubelet_dir, target) {
        Some(pod) if pod == uid => Ok(PathBuf::from(target)),
        _ => Err(RequestError::Target {
            target: target.into(),
            kubelet_dir: kubelet_dir.display().to_string(),
            uid: uid.into(),
        }),
    }
}

/// The pod uid of `<kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`,
/// written plainly (no `.`, `..`, doubled or trailing slashes), the only
/// place drafs mounts or unmounts; None for any other path.
pub fn volume_dir_pod<'a>(kubelet_dir: &Path, target: &'a str) -> Option<&'a str> {
    let path = Path::new(target);
    let plain = path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && !target.contains("//")
        && !target.ends_with('/');
    let rest = path.strip_prefix(kubelet_dir.join("pods")).ok()?;
    match rest.components().collect::<Vec<_>>().as_slice() {
        [
            Component::Normal(uid),
            Component::Normal(v),
            Component::Normal(csi),
            Component::Normal(_),
            Component::Normal(m),
        ] if plain && *v == "volumes" && *csi == "kubernetes.io~csi" && *m == "mount" => uid.to_str(),
        _ => None,
    }
}

/// The token for the API server's own audience (`""` in `tokenRequests`).
fn api_token(tokens: Option<&str>, driver: &str, token_in: TokenIn) -> Result<String, RequestError> {
    #[derive(serde::Deserialize)]
    struct Token {
        token: String,
    }
    let Some(tokens) = tokens else { return Err(RequestError::NoToken(driver.into(), token_in)) };
    let tokens: BTreeMap<String, Token> =
        serde_json::from_str(tokens).map_err(|e| RequestError::BadTokens(e.to_string()))?;
    tokens
        .get("")
        .map(|t| t.token.clone())
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| RequestError::NoToken(driver.into(), token_in))
}

fn options(ctx: &BTreeMap<String, String>) -> Result<(Selection, Vec<RequirePath>, View), RequestError> {
    let list = |v: &str| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect::<Vec<_>>();
    let (mut claims, mut require, mut from_drivers, mut view) = (Vec::new(), Vec::new(), None, View::Tree);
    for (key, value) in ctx {
        match key.as_str() {
            CLAIMS_OPTION => claims = list(value),
            VIEW_OPTION => match value.trim() {
                "" | "tree" => view = View::Tree,
                "standard" => view = View::Standard { from_drivers: Vec::new() },
                other => return Err(RequestError::View(other.into())),
            },
            METADATA_FROM_DRIVERS_OPTION => {
                let names = list(value)
                    .iter()
                    .map(|d| crate::model::names::parse_driver_name(d).map_err(RequestError::FromDrivers))
                    .collect::<Result<Vec<_>, _>>()?;
                from_drivers = Some(names);
            }
            REQUIRE_OPTION => {
                require = list(value)
                    .iter()
                    .map(|p| p.parse::<RequirePath>().map_err(|e| RequestError::Require(e.to_string())))
                    .collect::<Result<_, _>>()?;
                if let Some(p) = require.iter().find(|p| p.known_after_prepare()) {
                    return Err(RequestError::RequirePrepared(p.to_string()));
                }
            }
            k if k.starts_with(KUBELET_PREFIX) => {}
            k => return Err(RequestError::UnknownOption(k.into())),
        }
    }
    match (&mut view, from_drivers) {
        (View::Standard { from_drivers }, Some(names)) => *from_drivers = names,
        (View::Tree, Some(_)) => {
            return Err(RequestError::FromDrivers(
                "applies to the standard view only: set `view: standard` beside it".into(),
            ));
        }
        (_, None) => {}
    }
    Ok((Selection { claims }, require, view))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBELET: &str = "/var/lib/kubelet";
    const TARGET: &str = "/var/lib/kubelet/pods/0a1b/volumes/kubernetes.io~csi/dra/mount";

    fn request() -> NodePublishVolumeRequest {
        let ctx = [
            (EPHEMERAL, "true"),
            (POD_NAME, "app"),
            (POD_NAMESPACE, "team"),
            (POD_UID, "0a1b"),
            ("csi.storage.k8s.io/serviceAccount.name", "default"),
            (TOKENS, r#"{"":{"token":"eyJ.a.b","expirationTimestamp":"2026-12-03T12:00:00Z"},"vault":{"token":"x"}}"#),
        ];
        NodePublishVolumeRequest {
            volume_id: "csi-4f".into(),
            target_path: TARGET.into(),
            readonly: true,
            block: false,
            mount_flags: Vec::new(),
            volume_context: ctx.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            secrets: Default::default(),
        }
    }

    fn check(req: &NodePublishVolumeRequest) -> Result<Publish, RequestError> {
        Publish::check(req, Path::new(KUBELET), "drafs.dev", TokenIn::VolumeContext)
    }

    #[test]
    fn a_pods_publish_is_read() {
        let p = check(&request()).unwrap();
        assert_eq!(p.pod, PodRef { namespace: "team".into(), name: "app".into() });
        assert_eq!((p.pod_uid.as_str(), p.token.as_str()), ("0a1b", "eyJ.a.b"));
        assert_eq!(p.target, Path::new(TARGET));
        assert!(p.selection.claims.is_empty() && p.require.is_empty());
        assert!(!format!("{p:?}").contains("eyJ"), "the token stays out of logs");
    }

    /// With `serviceAccountTokenInSecrets: true` (KEP-5538) the kubelet sends
    /// the tokens in the request's secrets, not its context.
    #[test]
    fn the_token_is_read_from_the_secrets_when_the_kubelet_puts_it_there() {
        let mut req = request();
        let tokens = req.volume_context.remove(TOKENS).unwrap();
        req.secrets.insert(TOKENS.into(), tokens);
        let p = Publish::check(&req, Path::new(KUBELET), "drafs.dev", TokenIn::Secrets).unwrap();
        assert_eq!(p.token, "eyJ.a.b");
        assert!(!format!("{req:?}").contains("eyJ"), "the request's secrets stay out of logs");
    }

    /// The place the kubelet does not use is the tenant's: the secrets of the
    /// pod's `nodePublishSecretRef`, or its `volumeAttributes`. A token there
    /// is never used, even where the kubelet's is missing.
    #[test]
    fn a_token_the_tenant_put_in_the_other_place_is_never_used() {
        let tenant = r#"{"":{"token":"TENANT-CHOSEN-TOKEN"}}"#;
        // Without serviceAccountTokenInSecrets: the kubelet's is in the context; the secrets are the pod's.
        let mut req = request();
        req.secrets.insert(TOKENS.into(), tenant.into());
        assert_eq!(check(&req).unwrap().token, "eyJ.a.b");
        req.volume_context.remove(TOKENS);
        let err = check(&req).unwrap_err();
        assert_eq!(err, RequestError::NoToken("drafs.dev".into(), TokenIn::VolumeContext));
        assert!(err.to_string().contains("--token-in=volume-context"), "{err}");
        // With it: the kubelet's is in the secrets; the context's is the pod's volumeAttributes.
        let mut req = request();
        let kubelets = req.volume_context.insert(TOKENS.into(), tenant.into()).unwrap();
        req.secrets.insert(TOKENS.into(), kubelets);
        let secrets =
            |req: &NodePublishVolumeRequest| Publish::check(req, Path::new(KUBELET), "drafs.dev", TokenIn::Secrets);
        assert_eq!(secrets(&req).unwrap().token, "eyJ.a.b");
        req.secrets.clear();
        let err = secrets(&req).unwrap_err();
        assert!(err.to_string().contains("serviceAccountTokenInSecrets: true"), "{err}");
    }

    /// The kubelet's SELinux label (CSIDriver `seLinuxMount: true`) goes to
    /// the tmpfs; nothing else in the mount flags, and nothing that could add
    /// a mount option of its own.
    #[test]
    fn the_kubelets_selinux_context_is_the_only_mount_flag() {
        let with = |flags: &[&str]| {
            let mut req = request();
            req.mount_flags = flags.iter().map(|f| f.to_string()).collect();
            check(&req)
        };
        assert_eq!(check(&request()).unwrap().selinux_context, None);
        let label = "system_u:object_r:container_file_t:s0:c12,c345";
        for flag in [format!("context=\"{label}\""), format!("context={label}")] {
            assert_eq!(with(&[&flag]).unwrap().selinux_context.as_deref(), Some(label), "{flag}");
        }
        let mls = "system_u:object_r:container_file_t:s0-s0:c0.c1023";
        assert_eq!(with(&[&format!("context=\"{mls}\"")]).unwrap().selinux_context.as_deref(), Some(mls));
        for bad in [
            "noexec",
            "context=\"a:b:c\",uid=0",
            "context=\"a:b:c\"\"",
            "context=a:b:c,size=1G",
            "context=\"a:b\"",
            "context=\"a::c\"",
            "context=\"a:b:c d\"",
            "defcontext=\"a:b:c\"",
            "context=\"\"",
        ] {
            let err = with(&[bad]).unwrap_err();
            assert_eq!(err, RequestError::MountFlag(bad.into()), "{bad}");
        }
        let twice = with(&["context=\"a:b:c\"", "context=\"a:b:d\""]).unwrap_err();
        assert_eq!(twice, RequestError::MountFlag("context=\"a:b:d\"".into()));
        assert!(twice.to_string().contains("only the kubelet's SELinux `context="), "{twice}");
    }

    #[test]
    fn options_select_claims_and_require_paths() {
        let mut req = request();
        req.volume_context.insert("claims".into(), "gpu, nic".into());
        req.volume_context.insert("require".into(), "gpu/gpu/0/uuid".into());
        let p = check(&req).unwrap();
        assert_eq!(p.selection.claims, ["gpu", "nic"]);
        assert_eq!(p.require, ["gpu/gpu/0/uuid".parse::<RequirePath>().unwrap()]);

        for prepared in ["nic/nic/0/.status/interfaceName", "gpu/gpu/0/.health"] {
            req.volume_context.insert("require".into(), prepared.into());
            assert_eq!(check(&req), Err(RequestError::RequirePrepared(prepared.into())));
        }
        req.volume_context.insert("require".into(), "../etc".into());
        assert!(matches!(check(&req), Err(RequestError::Require(_))));
        req.volume_context.remove("require");
        req.volume_context.insert("dir".into(), "/".into());
        assert_eq!(check(&req), Err(RequestError::UnknownOption("dir".into())));
    }

    #[test]
    fn a_volume_serves_the_tree_or_the_standard_view() {
        let mut req = request();
        assert_eq!(check(&req).unwrap().view, View::Tree);
        req.volume_context.insert(VIEW_OPTION.into(), "tree".into());
        assert_eq!(check(&req).unwrap().view, View::Tree);
        req.volume_context.insert(VIEW_OPTION.into(), "standard".into());
        assert_eq!(check(&req).unwrap().view, View::Standard { from_drivers: vec![] });
        req.volume_context.insert(METADATA_FROM_DRIVERS_OPTION.into(), "dra.net, gpu.example.com".into());
        let from_drivers = vec!["dra.net".to_string(), "gpu.example.com".to_string()];
        assert_eq!(check(&req).unwrap().view, View::Standard { from_drivers });

        req.volume_context.insert(METADATA_FROM_DRIVERS_OPTION.into(), "../etc".into());
        assert!(matches!(check(&req), Err(RequestError::FromDrivers(_))), "a driver name is a DNS subdomain");
        req.volume_context.insert(METADATA_FROM_DRIVERS_OPTION.into(), "dra.net".into());
        req.volume_context.insert(VIEW_OPTION.into(), "tree".into());
        let err = check(&req).unwrap_err();
        assert!(err.to_string().contains("view: standard"), "{err}");
        req.volume_context.insert(VIEW_OPTION.into(), "Standard".into());
        assert_eq!(check(&req), Err(RequestError::View("Standard".into())));
    }

    #[test]
    fn what_drafs_cannot_serve_is_refused_with_the_fix() {
        let mut req = request();
        req.volume_context.remove(EPHEMERAL);
        assert_eq!(check(&req), Err(RequestError::NotEphemeral));
        let mut req = request();
        req.readonly = false;
        assert_eq!(check(&req), Err(RequestError::Writable));
        let mut req = request();
        req.block = true;
        assert_eq!(check(&req), Err(RequestError::Block));
        let mut req = request();
        req.volume_context.remove(POD_UID);
        assert_eq!(check(&req), Err(RequestError::NoPodInfo(POD_UID, "drafs.dev".into())));
        let mut req = request();
        req.volume_context.remove(TOKENS);
        assert!(check(&req).unwrap_err().to_string().contains("tokenRequests"));
        let mut req = request();
        req.volume_context.insert(TOKENS.into(), r#"{"vault":{"token":"x"}}"#.into());
        assert_eq!(check(&req), Err(RequestError::NoToken("drafs.dev".into(), TokenIn::VolumeContext)));
        req.volume_context.insert(TOKENS.into(), "{".into());
        assert!(matches!(check(&req), Err(RequestError::BadTokens(_))));
        req.volume_context.insert(TOKENS.into(), r#"{"":{"token":"a\nb"}}"#.into());
        assert_eq!(
            check(&req),
            Err(RequestError::NoToken("drafs.dev".into(), TokenIn::VolumeContext)),
            "a token that cannot be a header"
        );
    }

    #[test]
    fn only_the_pods_own_volume_directory_is_a_target() {
        for target in [
            "/var/lib/kubelet/pods/0a1b/volumes/kubernetes.io~csi/dra/mount/..",
            "/var/lib/kubelet/pods/0a1b/volumes/kubernetes.io~csi/../../../../../etc/mount",
            "/var/lib/kubelet/pods/0a1b/volumes/kubernetes.io~csi/./mount",
            "/var/lib/kubelet/pods/0a1b/volumes/kubernetes.io~csi/dra//mount",
            "/var/lib/kubelet/pods/0a1b/volumes/kubernetes.io~csi/dra/mount/",
            "/var/lib/kubelet/pods/other/volumes/kubernetes.io~csi/dra/mount",
            "/var/lib/kubelet/pods/0a1b/volumes/kubernetes.io~empty-dir/dra/mount",
            "/var/lib/kubelet/pods/0a1b/volumes/kubernetes.io~csi/dra/data",
            "/etc",
            "relative/pods/0a1b/volumes/kubernetes.io~csi/dra/mount",
            "",
        ] {
            let mut req = request();
            req.target_path = target.into();
            assert!(matches!(check(&req), Err(RequestError::Target { .. })), "{target:?} was accepted");
        }
        // Unpublish asks the same of a path, whoever's pod it is.
        assert_eq!(
            volume_dir_pod(Path::new(KUBELET), "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/dra/mount"),
            Some("u")
        );
        for p in [
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/dra",
            "/var/lib/kubelet/plugins/u/volumes/kubernetes.io~csi/dra/mount",
            "/etc",
        ] {
            assert_eq!(volume_dir_pod(Path::new(KUBELET), p), None, "{p}");
        }
        let mut req = request();
        req.volume_context.insert(POD_UID.into(), "../0a1b".into());
        assert_eq!(check(&req), Err(RequestError::BadName));
    }
}
