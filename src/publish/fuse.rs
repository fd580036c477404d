//! The FUSE backend: a thin adapter from kernel requests to [`FsSnapshot`].
//!
//! Reads are answered from the current snapshot (an `Arc` swapped on change), with
//! long entry/attr TTLs and kernel page caching (no-open mode, or `FOPEN_KEEP_CACHE`).
//! After each swap a dedicated thread tells the kernel what to forget; never a
//! FUSE callback, which would deadlock against the kernel waiting on it.
//!
//! No FUSE passthrough (kernel 6.9+): its backing file is named in the reply to
//! an `OPEN`, so every open would reach drafs again, where no-open mode sends
//! none: an open+read+close measured 8.5 times slower (docs/performance.md).

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use fuser::{
    BackgroundSession, Config, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, MountOption, Notifier, OpenFlags, PollEvents,
    PollFlags, PollNotifier, ReplyAttr, ReplyBmap, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL,
};
use tracing::{debug, info, warn};

use crate::model::tree::Tree;
use crate::publish::fsmodel::{
    FsError, FsSnapshot, InodeAllocator, Invalidation, KernelRefs, Kind, Node, invalidations,
};
use crate::publish::metrics::Metrics;

/// How long the kernel may cache names and attributes. Changes are pushed, so
/// this only bounds staleness if a push were lost.
const TTL: Duration = Duration::from_secs(60);

/// Errors of the FUSE backend.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    #[error("cannot mount FUSE at {dir}: {source} (needs /dev/fuse and CAP_SYS_ADMIN, or use --backend files)")]
    Mount { dir: PathBuf, source: io::Error },
    #[error("cannot prepare mount point {dir}: {source}")]
    MountPoint { dir: PathBuf, source: io::Error },
    #[error("a live drafs FUSE mount is already at {dir} (another drafs serve?); refusing to mount over it")]
    AlreadyServed { dir: PathBuf },
    #[error("{dir} is not a drafs FUSE mount ({what}); refusing to unmount it")]
    NotOurs { dir: PathBuf, what: String },
}

/// One line of /proc/self/mountinfo, the parts drafs looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub id: u64,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

impl MountEntry {
    /// Mounted by drafs: a FUSE mount named `drafs` (the kernel shows the type as
    /// `fuse`, or `fuse.drafs` where the subtype is kept).
    pub fn is_drafs(&self) -> bool {
        (self.fs_type == "fuse" || self.fs_type == "fuse.drafs") && self.source == "drafs"
    }
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            out.push((bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse mountinfo text (pure, for tests).
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            Some(MountEntry {
                id: left.first()?.parse().ok()?,
                mount_point: PathBuf::from(unescape(left.get(4)?)),
                fs_type: right.next()?.to_string(),
                source: unescape(right.next()?),
            })
        })
        .collect()
}

/// The mount on top at `dir` (the last one listed for it), if any.
pub fn top_mount(dir: &Path) -> Option<MountEntry> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_mountinfo(&text).into_iter().rev().find(|m| m.mount_point == dir)
}

/// Whether the mount `id` is still mounted anywhere.
pub fn is_mounted_id(id: u64) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|text| parse_mountinfo(&text).iter().any(|m| m.id == id))
}

type Current = Arc<RwLock<Arc<FsSnapshot>>>;

/// The snapshot being served (a poisoned lock still holds a complete snapshot).
fn load(current: &Current) -> Arc<FsSnapshot> {
    current.read().map(|g| g.clone()).unwrap_or_else(|p| p.into_inner().clone())
}

type Refs = Arc<Mutex<KernelRefs>>;

fn lock(refs: &Refs) -> std::sync::MutexGuard<'_, KernelRefs> {
    refs.lock().unwrap_or_else(|p| p.into_inner())
}

struct DraFs {
    current: Current,
    refs: Refs,
    metrics: Option<Arc<Metrics>>,
    no_open: AtomicBool,
    uid: u32,
    gid: u32,
}

impl DraFs {
    fn snapshot(&self) -> Arc<FsSnapshot> {
        load(&self.current)
    }

    /// The node of `ino`: the current snapshot's, or a replaced one the kernel still holds.
    fn node(&self, ino: u64) -> Option<Node> {
        if let Some(node) = self.snapshot().node(ino) {
            return Some(node.clone());
        }
        lock(&self.refs).retired(ino).cloned()
    }

    fn attr(&self, node: &Node) -> FileAttr {
        FileAttr {
            ino: INodeNo(node.ino),
            size: node.size(),
            blocks: node.size().div_ceil(512),
            atime: node.mtime,
            mtime: node.mtime,
            ctime: node.mtime,
            crtime: node.mtime,
            kind: match node.kind {
                Kind::Dir => FileType::Directory,
                Kind::File => FileType::RegularFile,
            },
            perm: node.perm(),
            nlink: if node.kind == Kind::Dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

fn errno(e: FsError) -> Errno {
    Errno::from_i32(e.errno())
}

impl Filesystem for DraFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let wanted = InitFlags::FUSE_NO_OPEN_SUPPORT | InitFlags::FUSE_NO_OPENDIR_SUPPORT;
        if config.capabilities().contains(wanted) && config.add_capabilities(wanted).is_ok() {
            self.no_open.store(true, Ordering::Relaxed);
        }
        debug!(no_open = self.no_open.load(Ordering::Relaxed), "FUSE session initialized");
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let snap = self.snapshot();
        let Some(name) = name.to_str() else { return reply.error(Errno::ENOENT) };
        match snap.lookup(parent.0, name) {
            Ok(node) => {
                lock(&self.refs).looked_up(node.ino);
                reply.entry(&TTL, &self.attr(node), Generation(0))
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        lock(&self.refs).forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.node(ino.0) {
            Some(node) => reply.attr(&TTL, &self.attr(&node)),
            // An inode replaced long ago: the kernel retries a path lookup afresh.
            None => reply.error(Errno::ESTALE),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open.load(Ordering::Relaxed) {
            // The kernel stops sending opens and keeps the page cache.
            return reply.error(Errno::ENOSYS);
        }
        match self.node(ino.0) {
            Some(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open.load(Ordering::Relaxed) {
            return reply.error(Errno::ENOSYS);
        }
        match self.snapshot().node(ino.0) {
            Some(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if let Some(m) = &self.metrics {
            m.fuse_read();
        }
        let snap = self.snapshot();
        match snap.read(ino.0, offset, size) {
            Ok(data) => reply.data(data),
            Err(FsError::NotFound) => match self.node(ino.0) {
                // A value replaced since the reader looked it up: it reads that value, whole.
                Some(node) if node.kind == Kind::File => {
                    let start = (offset as usize).min(node.content.len());
                    let end = start.saturating_add(size as usize).min(node.content.len());
                    reply.data(&node.content[start..end])
                }
                Some(_) => reply.error(Errno::EISDIR),
                None => reply.error(Errno::ESTALE),
            },
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.snapshot().readdir(ino.0) {
            Ok(entries) => {
                for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
                    let kind = if kind == Kind::Dir { FileType::Directory } else { FileType::RegularFile };
                    if reply.add(INodeNo(child), (i + 1) as u64, kind, &name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Nothing to flush on a read-only tree; ENOSYS makes the kernel stop
        // sending a FLUSH on every close.
        reply.error(Errno::ENOSYS);
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        // ENOSYS makes the kernel stop asking for extended attributes.
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    // The operations below are answered quietly (fuser's defaults log three
    // lines each, and ordinary readers trigger them: Python's open() issues an
    // ioctl to ask whether the file is a terminal).

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // "Inappropriate ioctl for device", what a regular file answers.
        reply.error(Errno::ENOTTY);
    }

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn setlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn bmap(&self, _req: &Request, _ino: INodeNo, _blocksize: u32, _idx: u64, reply: ReplyBmap) {
        reply.error(Errno::ENOSYS);
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        // ENOSYS: the kernel treats the file as always ready, like a regular file.
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn lseek(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _offset: i64, _whence: i32, reply: ReplyLseek) {
        // ENOSYS: the kernel seeks by itself from then on.
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.snapshot().node_count() as u64;
        reply.statfs(0, 0, 0, files, 0, 4096, 255, 4096);
    }
}

/// A mounted tree. Dropping it unmounts (lazily if files are still open).
pub struct FuseMount {
    dir: PathBuf,
    /// This mount's id in /proc/self/mountinfo: what is unmounted, and watched, is this one.
    mount_id: Option<u64>,
    current: Current,
    refs: Refs,
    inodes: InodeAllocator,
    session: Option<BackgroundSession>,
    invalidate: Option<mpsc::Sender<Vec<Invalidation>>>,
    notifier_thread: Option<std::thread::JoinHandle<()>>,
}

impl FuseMount {
    /// Clear a stale mount left at `dir`, then mount an empty tree there.
    pub fn mount(dir: &Path, metrics: Option<Arc<Metrics>>) -> Result<Self, FuseError> {
        prepare_mount_point(dir)?;
        let current: Current = Arc::new(RwLock::new(Arc::new(FsSnapshot::empty())));
        let refs: Refs = Arc::default();
        let fs = DraFs {
            current: current.clone(),
            refs: refs.clone(),
            metrics,
            no_open: AtomicBool::new(false),
            // SAFETY: geteuid/getegid have no preconditions and cannot fail.
            uid: unsafe { libc::geteuid() },
            gid: unsafe { libc::getegid() },
        };
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("drafs".into()),
            MountOption::Subtype("drafs".into()),
            MountOption::RO,
            MountOption::DefaultPermissions,
            MountOption::NoDev,
            MountOption::NoSuid,
            MountOption::NoExec,
        ];
        // allow_other: the app may run as any uid; DefaultPermissions enforces 0444/0555.
        config.acl = SessionACL::All;
        config.n_threads = Some(2);
        let session = fuser::spawn_mount(fs, dir, &config)
            .map_err(|source| FuseError::Mount { dir: dir.to_path_buf(), source })?;
        let (tx, rx) = mpsc::channel::<Vec<Invalidation>>();
        let notifier = session.notifier();
        let notifier_thread = std::thread::Builder::new()
            .name("drafs-inval".into())
            .spawn(move || notify_loop(notifier, rx))
            .map_err(|source| FuseError::Mount { dir: dir.to_path_buf(), source })?;
        let mount_id = top_mount(dir).filter(MountEntry::is_drafs).map(|m| m.id);
        info!(dir = %dir.display(), mount_id, "FUSE mounted");
        Ok(FuseMount {
            dir: dir.to_path_buf(),
            mount_id,
            current,
            refs,
            inodes: InodeAllocator::default(),
            session: Some(session),
            invalidate: Some(tx),
            notifier_thread: Some(notifier_thread),
        })
    }

    /// Swap in a new tree and push the invalidations it needs.
    pub fn update(&mut self, tree: &Tree) {
        let old = load(&self.current);
        let new = Arc::new(FsSnapshot::build(tree, &mut self.inodes, Some(&old)));
        let changes = invalidations(&old, &new);
        // Nodes the new snapshot replaces stay readable while the kernel may
        // hold them; they are retired before the swap so no request misses them.
        lock(&self.refs).retire(&old, &new, Instant::now());
        match self.current.write() {
            Ok(mut g) => *g = new,
            Err(p) => *p.into_inner() = new,
        }
        if !changes.is_empty()
            && let Some(tx) = &self.invalidate
        {
            let _ = tx.send(changes);
        }
    }

    /// This mount's id (to notice when it is gone).
    pub fn mount_id(&self) -> Option<u64> {
        self.mount_id
    }

    /// Replaced nodes still kept for the kernel, and the bytes of their content.
    pub fn retired_size(&self) -> (usize, usize) {
        lock(&self.refs).retired_size()
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        self.invalidate.take();
        if let Some(t) = self.notifier_thread.take() {
            let _ = t.join();
        }
        // The session unmounts on drop; if files are still open that fails with
        // EBUSY and the lazy unmount below detaches the tree instead, but only if
        // the mount on top there is still this one (never another instance's).
        drop(self.session.take());
        if let Some(id) = self.mount_id
            && top_mount(&self.dir).is_some_and(|m| m.id == id)
        {
            unmount(&self.dir);
        }
    }
}

fn notify_loop(notifier: Notifier, rx: mpsc::Receiver<Vec<Invalidation>>) {
    for batch in rx {
        for inv in batch {
            let result = match &inv {
                Invalidation::Inode(ino) => notifier.inval_inode(INodeNo(*ino), 0, 0),
                Invalidation::Entry { parent, name } => notifier.inval_entry(INodeNo(*parent), OsStr::new(name)),
                Invalidation::Deleted { parent, child, name } => {
                    notifier.delete(INodeNo(*parent), INodeNo(*child), OsStr::new(name))
                }
            };
            // ENOENT: the kernel had nothing cached for it, which is fine.
            if let Err(e) = result
                && e.raw_os_error() != Some(libc::ENOENT)
            {
                debug!(?inv, "invalidation not delivered: {e}");
            }
        }
    }
}

fn c_path(path: &Path) -> Option<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()
}

/// True when `dir` is a mount whose FUSE server is gone. `statfs` always reaches
/// the server (a `stat` may be answered from the kernel's attribute cache), so it
/// fails with ENOTCONN on such a mount.
pub fn is_stale_mount(dir: &Path) -> bool {
    let Some(path) = c_path(dir) else { return false };
    let mut buf = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a valid path and a buffer of the right type.
    let rc = unsafe { libc::statfs(path.as_ptr(), buf.as_mut_ptr()) };
    rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

/// `drafs unmount`: unmount `dir` only if a drafs FUSE tree is mounted there.
pub fn unmount_ours(dir: &Path) -> Result<(), FuseError> {
    match top_mount(dir) {
        Some(m) if m.is_drafs() => {
            unmount(dir);
            Ok(())
        }
        Some(m) => Err(FuseError::NotOurs { dir: dir.to_path_buf(), what: format!("{} from {}", m.fs_type, m.source) }),
        None => {
            info!(dir = %dir.display(), "nothing mounted");
            Ok(())
        }
    }
}

/// Unmount `dir`: a plain unmount, or a lazy one if files are still open.
pub fn unmount(dir: &Path) {
    let Some(path) = c_path(dir) else { return };
    // SAFETY: path is a valid NUL-terminated string for the duration of the calls.
    let rc = unsafe { libc::umount2(path.as_ptr(), 0) };
    if rc == 0 {
        info!(dir = %dir.display(), "unmounted");
        return;
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOENT) => {} // not mounted (any more)
        _ => {
            // SAFETY: as above.
            let rc = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            if rc == 0 {
                info!(dir = %dir.display(), "unmounted lazily ({err}: files still open)");
            } else {
                warn!(dir = %dir.display(), "cannot unmount: {}", io::Error::last_os_error());
            }
        }
    }
}

fn prepare_mount_point(dir: &Path) -> Result<(), FuseError> {
    if is_stale_mount(dir) {
        warn!(dir = %dir.display(), "clearing a stale FUSE mount left by an earlier instance");
        unmount(dir);
    } else if top_mount(dir).is_some_and(|m| m.is_drafs()) {
        return Err(FuseError::AlreadyServed { dir: dir.to_path_buf() });
    }
    std::fs::create_dir_all(dir).map_err(|source| FuseError::MountPoint { dir: dir.to_path_buf(), source })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let text = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
            98 30 0:50 / /tmp/a\\040b/dra rw,nosuid,nodev,relatime - fuse.drafs drafs ro,user_id=0\n\
            99 98 0:51 / /tmp/a\\040b/dra rw shared:7 - tmpfs tmpfs rw\n\
            bad line\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[1].mount_point, PathBuf::from("/tmp/a b/dra"));
        assert!(mounts[1].is_drafs());
        assert_eq!(mounts[1].id, 98);
        assert!(!mounts[2].is_drafs());
        assert_eq!(unescape("x\\011y\\\\"), "x\ty\\\\");
    }
}
