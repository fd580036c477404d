//! The mounts the node agent makes: a tmpfs at each published target, and
//! nothing else. Behind a small trait so that the volume bookkeeping is tested
//! without privileges; the system implementation reads `/proc/self/mountinfo`
//! to tell its own mounts (a tmpfs drafs made, by its mount source) from
//! anything else at a path.

use std::io;
use std::path::Path;

use crate::publish::files::Room;

/// The mount source of every tmpfs drafs makes: how a restarted agent (and
/// an unpublish) knows a mount at a target is its own.
pub const SOURCE: &str = "drafs-node";

/// What is at a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtTarget {
    Nothing,
    /// A tmpfs drafs mounted.
    Ours,
    /// Someone else's mount: never written to or unmounted.
    Foreign,
}

pub trait Mounts: Send + Sync + 'static {
    /// Mount a fresh tmpfs at `target` (a directory), holding at most `size`,
    /// every file of it labelled `selinux_context` when given (checked by
    /// `request`: no `"` or `=` in it).
    fn mount_tmpfs(&self, target: &Path, size: Room, selinux_context: Option<&str>) -> io::Result<()>;
    /// Detach the mount at `target`.
    fn unmount(&self, target: &Path) -> io::Result<()>;
    /// What is mounted at `target` (exactly there, not above it).
    fn at(&self, target: &Path) -> io::Result<AtTarget>;
}

/// The real mount table.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemMounts;

impl Mounts for SystemMounts {
    fn mount_tmpfs(&self, target: &Path, size: Room, selinux_context: Option<&str>) -> io::Result<()> {
        use nix::mount::{MsFlags, mount};
        let mut data = format!("size={},nr_inodes={},mode=0755", size.bytes, size.inodes);
        if let Some(label) = selinux_context {
            data.push_str(&format!(",context=\"{label}\""));
        }
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(Some(SOURCE), target, Some("tmpfs"), flags, Some(data.as_str())).map_err(io::Error::from)
    }

    /// Detached (a reader's open file does not hold it up); a symlink put at
    /// the target is not followed.
    fn unmount(&self, target: &Path) -> io::Result<()> {
        use nix::mount::{MntFlags, umount2};
        umount2(target, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW).map_err(io::Error::from)
    }

    fn at(&self, target: &Path) -> io::Result<AtTarget> {
        Ok(at_in(&std::fs::read_to_string("/proc/self/mountinfo")?, target))
    }
}

/// What `mountinfo` says is mounted at `target` (the last mount there wins:
/// it is the one on top).
pub fn at_in(mountinfo: &str, target: &Path) -> AtTarget {
    let mut at = AtTarget::Nothing;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else { continue };
        let (Some(point), Some(fstype), Some(source)) = (fields.get(4), fields.get(sep + 1), fields.get(sep + 2))
        else {
            continue;
        };
        if Path::new(&unescape(point)) == target {
            at = if *fstype == "tmpfs" && *source == SOURCE { AtTarget::Ours } else { AtTarget::Foreign };
        }
    }
    at
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(v) = u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("x"), 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 22 0:50 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/dra/mount rw,nosuid,nodev,noexec shared:40 - tmpfs drafs-node rw,size=16384k,mode=755
91 22 0:51 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/other/mount rw shared:41 - tmpfs tmpfs rw
92 22 0:52 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/sp\\040ace/mount rw shared:42 - tmpfs drafs-node rw
93 22 0:53 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/over/mount rw shared:43 - tmpfs drafs-node rw
94 93 0:54 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/over/mount rw shared:44 - fuse.x x rw
";

    /// The real calls, where the test may mount (as root: CI): a tmpfs of
    /// drafs's with its limits, told as its own, then gone.
    #[test]
    fn a_tmpfs_is_mounted_with_its_limits_and_detached() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("mount");
        std::fs::create_dir(&target).unwrap();
        let mounts = SystemMounts;
        match mounts.mount_tmpfs(&target, Room { bytes: 1 << 20, inodes: 64 }, None) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                return eprintln!("SKIPPED: mounting needs root ({e})");
            }
            result => result.unwrap(),
        }
        assert_eq!(mounts.at(&target).unwrap(), AtTarget::Ours);
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = info.lines().find(|l| l.contains(&*target.to_string_lossy())).unwrap();
        assert!(line.contains("nosuid") && line.contains("nodev") && line.contains("noexec"), "{line}");
        assert!(line.contains("size=1024k") && line.contains("nr_inodes=64"), "{line}");
        // A link put at the target is not followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(mounts.unmount(&link).is_err(), "unmounted through a link");
        assert_eq!(mounts.at(&target).unwrap(), AtTarget::Ours);
        mounts.unmount(&target).unwrap();
        assert_eq!(mounts.at(&target).unwrap(), AtTarget::Nothing);
    }

    /// The kubelet's SELinux label reaches the kernel as the tmpfs's
    /// `context=`: where the kernel has SELinux, every file written later in
    /// the tmpfs carries it; where it has none (this machine's kernel: no
    /// selinuxfs, and the kubelet then sends no label), the kernel refuses the
    /// option and nothing is mounted: a label is never dropped silently.
    #[test]
    fn a_tmpfs_takes_the_kubelets_selinux_context() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("mount");
        std::fs::create_dir(&target).unwrap();
        let label = "system_u:object_r:container_file_t:s0:c4,c7";
        let selinux = std::fs::read_to_string("/proc/filesystems").unwrap().contains("selinuxfs");
        match SystemMounts.mount_tmpfs(&target, Room { bytes: 1 << 20, inodes: 64 }, Some(label)) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                return eprintln!("SKIPPED: mounting needs root ({e})");
            }
            Err(e) if !selinux => {
                assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
                assert_eq!(SystemMounts.at(&target).unwrap(), AtTarget::Nothing);
                return;
            }
            result => result.unwrap(),
        }
        assert!(selinux, "a kernel without SELinux took a SELinux label");
        std::fs::create_dir(target.join("later")).unwrap();
        std::fs::write(target.join("later/uuid"), "GPU-1").unwrap();
        for file in [target.join("later"), target.join("later/uuid")] {
            use std::os::unix::ffi::OsStrExt;
            let path = std::ffi::CString::new(file.as_os_str().as_bytes()).unwrap();
            let mut value = [0u8; 256];
            // SAFETY: NUL-terminated strings and a buffer of the length given.
            let n = unsafe {
                libc::getxattr(path.as_ptr(), c"security.selinux".as_ptr(), value.as_mut_ptr().cast(), value.len())
            };
            let n = usize::try_from(n).unwrap_or_else(|_| panic!("{}: {}", file.display(), io::Error::last_os_error()));
            assert_eq!(String::from_utf8_lossy(&value[..n]).trim_end_matches('\0'), label, "{}", file.display());
        }
        SystemMounts.unmount(&target).unwrap();
    }

    #[test]
    fn its_own_mounts_are_told_from_others() {
        let at = |p: &str| at_in(INFO, Path::new(&format!("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/{p}")));
        assert_eq!(at("dra/mount"), AtTarget::Ours);
        assert_eq!(at("other/mount"), AtTarget::Foreign, "a tmpfs someone else made");
        assert_eq!(at("sp ace/mount"), AtTarget::Ours, "escaped names");
        assert_eq!(at("over/mount"), AtTarget::Foreign, "what is on top counts");
        assert_eq!(at("dra"), AtTarget::Nothing, "a path above a mount is not it");
        assert_eq!(at("none/mount"), AtTarget::Nothing);
        assert_eq!(at_in("garbage\n\n1 2 3\n", Path::new("/")), AtTarget::Nothing);
    }
}
