//! `drafs copy-self`: install this static binary in a shared directory, for
//! containers to use as an entrypoint wrapper (`drafs exec`).

use std::path::Path;

use tracing::info;

use crate::cmd::Failure;

/// `copy-self`: install this binary as DIR/drafs (atomically, mode 0755).
///
/// The directory is shared with other containers, so nothing in it is
/// trusted: the copy goes to a new file of a fresh name, created exclusively
/// and never through a link, and is renamed over `drafs` (which replaces a link
/// there rather than writing through it).
pub fn run(to: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |what: &str, e: std::io::Error| Failure::Failed(format!("copy-self: cannot {what}: {e}"));
    let me = std::env::current_exe().map_err(|e| failed("find this binary", e))?;
    std::fs::create_dir_all(to).map_err(|e| failed(&format!("create {}", to.display()), e))?;
    let dest = to.join("drafs");
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let tmp = to.join(format!(".drafs.{}.{nanos}.tmp", std::process::id()));
    let write = || -> Result<(), Failure> {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| failed(&format!("create {}", tmp.display()), e))?;
        let mut src = std::fs::File::open(&me).map_err(|e| failed(&format!("read {}", me.display()), e))?;
        std::io::copy(&mut src, &mut out).map_err(|e| failed(&format!("write {}", tmp.display()), e))?;
        // fchmod on the open file: the umask may have narrowed the mode.
        out.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| failed(&format!("chmod {}", tmp.display()), e))?;
        out.sync_all().map_err(|e| failed(&format!("sync {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &dest).map_err(|e| failed(&format!("rename to {}", dest.display()), e))
    };
    let result = write();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    info!(to = %dest.display(), "copied");
    Ok(())
}
