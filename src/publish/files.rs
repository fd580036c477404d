//! The files backend: a [`Tree`] written into a directory atomically.
//!
//! The layout is the kubelet's for downward API and ConfigMap volumes: the payload
//! goes into a fresh hidden directory `..<stamp>`, the `..data` symlink is swapped
//! to it with one `rename`, and every top-level entry is a symlink through `..data`.
//! A reader therefore sees the old tree or the new one, never a mix.
//!
//! Unlike the kubelet's writer, drafs does not remove a superseded payload at
//! the swap: a reader inside it (a working directory, an open directory, a
//! walk of the tree that began before the swap) goes on reading the old,
//! complete tree. A superseded payload is removed once it has been superseded
//! for [`Retention::keep_for`], or after [`Retention::at_least`] when more
//! than [`Retention::at_most`] are kept, or at once beyond
//! [`Retention::ceiling`] or when the room it takes is needed for a new tree.
//! Payloads are removed only when drafs can prove they are its own
//! (its name pattern and a marker file inside): anything else in the
//! directory is never deleted or written through.

use std::collections::{BTreeSet, VecDeque};
use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::model::tree::Tree;

pub const DATA_LINK: &str = "..data";
/// Every payload directory drafs writes holds this file: drafs removes only
/// `..` directories that have it and drafs's name pattern, nothing else.
const PAYLOAD_MARKER: &str = "..drafs-payload";

/// How long superseded payloads stay readable, and how many at once.
///
/// A reader inside a payload has [`Retention::at_least`] whatever the churn
/// (a driver that changes its devices every few hundred milliseconds while an
/// app walks its tree at start), and [`Retention::keep_for`] while few trees
/// are superseded; only a full filesystem or [`Retention::ceiling`] takes a
/// payload sooner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A reader that entered a payload before a swap has this long to finish
    /// in it while no more than [`Retention::at_most`] are kept (a walk of the
    /// tree takes milliseconds; a shell loop that runs `cat` per file, a
    /// second or two, more on a loaded node).
    pub keep_for: Duration,
    /// Superseded payloads kept for all of [`Retention::keep_for`]; beyond
    /// them, the oldest go once superseded for [`Retention::at_least`].
    pub at_most: usize,
    /// How long every superseded payload is kept, however many there are.
    pub at_least: Duration,
    /// Superseded payloads never kept beyond this many, whatever their age:
    /// the bound on a directory's payloads where the filesystem is large
    /// (where it is small, a tmpfs of the node agent's or an in-memory
    /// emptyDir, its room takes the oldest first; a file takes a page there,
    /// so their number, and the kernel's memory for them, stays bounded too).
    pub ceiling: usize,
}

/// The retention of every tree drafs keeps current (docs/tree.md).
pub const RETENTION: Retention =
    Retention { keep_for: Duration::from_secs(30), at_most: 2, at_least: Duration::from_secs(10), ceiling: 32 };

impl Retention {
    /// Nothing kept: for a writer nobody reads while it writes (`init`).
    pub const NONE: Retention =
        Retention { keep_for: Duration::ZERO, at_most: 0, at_least: Duration::ZERO, ceiling: 0 };

    /// How long after its swap the oldest of `kept` superseded payloads goes:
    /// the one rule both [`AtomicDir::tidy`] and [`AtomicDir::next_tidy`] follow.
    fn lifetime(&self, kept: usize) -> Duration {
        if kept > self.ceiling {
            Duration::ZERO
        } else if kept > self.at_most {
            self.at_least.min(self.keep_for)
        } else {
            self.keep_for
        }
    }
}

/// A filesystem operation that failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot {op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: io::Error },
    #[error(
        "refusing to replace {path}: it exists and was not written by drafs (expected a symlink to {DATA_LINK}/{name})"
    )]
    Foreign { path: PathBuf, name: String },
    #[error(
        "another drafs is writing to {path} (a second init or serve given the same --dir or --metadata-dir?); refusing to write beside it"
    )]
    Busy { path: PathBuf },
    #[error(
        "no room for the tree in {path}: it takes {need}, and {free} of {total} are free beside the tree served now (too few {}); nothing was changed",
        free.short_of(*need)
    )]
    NoRoom { path: PathBuf, need: Room, free: Room, total: Room },
}

/// Room on a filesystem, or what a tree takes of it: bytes in whole blocks, and inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Room {
    pub bytes: u64,
    pub inodes: u64,
}

impl Room {
    pub fn holds(&self, need: Room) -> bool {
        self.bytes >= need.bytes && self.inodes >= need.inodes
    }

    /// What this room lacks to hold `need`.
    fn short_of(&self, need: Room) -> &'static str {
        match (self.bytes < need.bytes, self.inodes < need.inodes) {
            (true, true) => "bytes and inodes",
            (true, false) => "bytes",
            _ => "inodes",
        }
    }

    /// What `tree` takes on a filesystem of `block`-byte blocks: each file's
    /// content in whole blocks, and an inode per file, directory and link.
    pub fn of_tree(tree: &Tree, block: u64) -> Room {
        let block = block.max(1);
        let bytes = tree.files().map(|(_, c)| (c.len() as u64).div_ceil(block) * block).sum();
        // Files, directories (the payload's root among them), the marker, the
        // top-level links and the swap link.
        let inodes = tree.len() + tree.dirs().len() + 1 + tree.top_level().len() + 1;
        Room { bytes, inodes: inodes as u64 }
    }
}

impl std::fmt::Display for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} KiB and {} inodes", self.bytes.div_ceil(1024), self.inodes)
    }
}

/// The free and total room of the filesystem holding `dir`; None when it
/// reports no limit (it has no fixed size).
fn room_at(dir: &Path) -> io::Result<Option<(Room, Room, u64)>> {
    use std::os::unix::ffi::OsStrExt;
    let path =
        std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs fills the struct it is given; the path is NUL-terminated and outlives the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.f_blocks == 0 {
        return Ok(None);
    }
    let block = st.f_frsize as u64;
    let free = Room { bytes: st.f_bavail as u64 * block, inodes: st.f_favail as u64 };
    let total = Room { bytes: st.f_blocks as u64 * block, inodes: st.f_files as u64 };
    Ok(Some((free, total, block)))
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> WriteError + 'a {
    move |source| WriteError::Io { op, path: path.to_path_buf(), source }
}

/// Writes trees into one directory; remembers the last one to skip no-op writes.
///
/// It holds an exclusive `flock` on the directory from its first write (or
/// [`AtomicDir::open`]) until it is dropped: two writers would each remove the
/// other's payload mid-write, so a second one is refused. The lock goes away
/// with the process, so a restarted drafs (or `serve` after `init`) takes over.
/// Runs that take turns on one directory in one process (the node agent's, for
/// a volume) share one [`DirTurns`] instead.
#[derive(Debug)]
pub struct AtomicDir {
    dir: PathBuf,
    last: Option<Tree>,
    lock: Option<Arc<DirTurns>>,
    retention: Retention,
    /// Superseded payloads still kept, oldest first, with when they were superseded.
    superseded: VecDeque<(String, Instant)>,
}

/// An exclusive `flock` on a directory drafs writes, held while the value
/// lives (and so never longer than the process): a second writer is refused
/// with [`WriteError::Busy`].
#[derive(Debug)]
pub struct DirLock {
    _file: fs::File,
}

impl DirLock {
    /// Create `dir` if needed and lock it.
    pub fn take(dir: &Path) -> Result<DirLock, WriteError> {
        fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
        let file = fs::File::open(dir).map_err(io_err("open", dir))?;
        // SAFETY: flock on a descriptor we own; it has no memory effects.
        let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(WriteError::Busy { path: dir.to_path_buf() });
            }
            // A filesystem without flock: write unguarded rather than not at all.
            tracing::debug!(dir = %dir.display(), "cannot lock the directory ({err}); writing without the lock");
        }
        Ok(DirLock { _file: file })
    }
}

/// A directory's lock, held by its owner (the node agent's volume) for as long
/// as it lives, and lent to each run that writes there in turn: a run that
/// replaces one whose last write is still under way waits for that write
/// instead of being refused as "another drafs", and their writes never
/// interleave.
#[derive(Debug)]
pub struct DirTurns {
    _lock: DirLock,
    turn: Mutex<()>,
}

impl DirTurns {
    pub fn take(dir: &Path) -> Result<Arc<DirTurns>, WriteError> {
        Ok(Arc::new(DirTurns { _lock: DirLock::take(dir)?, turn: Mutex::new(()) }))
    }

    /// This writer's turn: held for one write.
    pub fn turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.turn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl AtomicDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        AtomicDir { dir: dir.into(), last: None, lock: None, retention: RETENTION, superseded: VecDeque::new() }
    }

    /// Take the directory for this writer now if it exists (a second writer is
    /// refused at start, [`WriteError::Busy`]); one that does not exist yet is
    /// created and taken at the first write, so a run that fails before it
    /// leaves nothing behind.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, WriteError> {
        let mut out = Self::new(dir);
        if out.dir.is_dir() {
            out.lock()?;
        }
        Ok(out)
    }

    /// Write into a directory whose lock the caller holds and lends to each
    /// of its writers in turn.
    pub fn taking_turns(dir: impl Into<PathBuf>, turns: Arc<DirTurns>) -> Self {
        AtomicDir { lock: Some(turns), ..Self::new(dir) }
    }

    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    fn lock(&mut self) -> Result<(), WriteError> {
        if self.lock.is_none() {
            self.lock = Some(Arc::new(DirTurns { _lock: DirLock::take(&self.dir)?, turn: Mutex::new(()) }));
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Write `tree` unless it equals the last tree written; returns whether it wrote.
    pub fn write(&mut self, tree: &Tree) -> Result<bool, WriteError> {
        if self.last.as_ref() == Some(tree) {
            return Ok(false);
        }
        self.lock()?;
        let turns = self.lock.clone().expect("locked above");
        let _turn = turns.turn();
        let now = Instant::now();
        let top = tree.top_level();
        self.check_top_level(&top)?;
        self.adopt_unknown_payloads(now)?;
        self.make_room(tree)?;

        let payload_name = self.new_payload_dir()?;
        let payload = self.dir.join(&payload_name);
        if let Err(e) = write_payload(&payload, tree) {
            let _ = remove_tree(&payload);
            return Err(e);
        }

        // User-visible names new in this tree are linked before the swap: they
        // lead nowhere until ..data does, so every name (`.ready` too) appears
        // with the tree it belongs to, never after it. `.ready` goes last anyway.
        let ready = crate::model::layout::READY;
        let (last, rest): (Vec<&String>, Vec<&String>) = top.iter().partition(|n| *n == ready);
        let mut linked = Vec::new();
        let prelink = || -> Result<(), WriteError> {
            for name in rest.into_iter().chain(last) {
                let link = self.dir.join(name);
                if fs::symlink_metadata(&link).is_err() {
                    symlink(Path::new(DATA_LINK).join(name), &link).map_err(io_err("create symlink", &link))?;
                    linked.push(link);
                }
            }
            Ok(())
        };
        // Then swap ..data to the new payload in one rename, through a link of a
        // fresh name (a leftover or foreign entry of any name is never reused).
        let data = self.dir.join(DATA_LINK);
        let before = current_payload(&self.dir);
        let swapped = prelink().and_then(|()| self.fresh_link(&payload_name)).and_then(|tmp| {
            fs::rename(&tmp, &data).map_err(|e| {
                let _ = fs::remove_file(&tmp);
                io_err("rename into place", &data)(e)
            })
        });
        if let Err(e) = swapped {
            for link in linked {
                let _ = fs::remove_file(link);
            }
            let _ = remove_tree(&payload);
            return Err(e);
        }
        if let Some(before) = before.filter(|b| *b != payload_name) {
            self.superseded.retain(|(name, _)| *name != before);
            self.superseded.push_back((before, now));
        }

        // Drop the names whose target is gone, and swap links a killed writer left.
        for entry in fs::read_dir(&self.dir).map_err(io_err("read directory", &self.dir))? {
            let entry = entry.map_err(io_err("read directory", &self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with("..") {
                if is_our_swap_link(&path, &name) {
                    let _ = fs::remove_file(&path);
                }
            } else if !top.contains(&name) && is_our_link(&path, &name) {
                fs::remove_file(&path).map_err(io_err("remove stale symlink", &path))?;
            }
        }
        self.last = Some(tree.clone());
        self.tidy(now)?;
        Ok(true)
    }

    /// Remove the superseded payloads whose time is up (or beyond the number
    /// kept); when the next one is due, if any is kept.
    pub fn tidy(&mut self, now: Instant) -> Result<Option<Instant>, WriteError> {
        while let Some((name, at)) = self.superseded.front() {
            if now.saturating_duration_since(*at) < self.retention.lifetime(self.superseded.len()) {
                break;
            }
            let path = self.dir.join(name);
            if is_our_payload(&path, name) {
                remove_tree(&path)?;
            }
            self.superseded.pop_front();
        }
        Ok(self.next_tidy())
    }

    /// When [`AtomicDir::tidy`] has something to remove next.
    pub fn next_tidy(&self) -> Option<Instant> {
        let (_, at) = self.superseded.front()?;
        Some(*at + self.retention.lifetime(self.superseded.len()))
    }

    /// Payloads of drafs's that this writer did not supersede itself (an
    /// earlier run's or process's, a write that failed half-way): kept as if
    /// superseded now, since a reader may still be inside them.
    fn adopt_unknown_payloads(&mut self, now: Instant) -> Result<(), WriteError> {
        let current = current_payload(&self.dir);
        for entry in fs::read_dir(&self.dir).map_err(io_err("read directory", &self.dir))? {
            let entry = entry.map_err(io_err("read directory", &self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if current.as_deref() == Some(name.as_str()) || self.superseded.iter().any(|(n, _)| *n == name) {
                continue;
            }
            if is_our_payload(&entry.path(), &name) {
                self.superseded.push_back((name, now));
            }
        }
        Ok(())
    }

    /// Make room for `tree` beside the current one, removing the superseded
    /// payloads (oldest first) as needed; an error, with nothing changed,
    /// when even that is not enough.
    fn make_room(&mut self, tree: &Tree) -> Result<(), WriteError> {
        let room = || room_at(&self.dir).map_err(io_err("measure the free room of", &self.dir));
        loop {
            let Some((free, total, block)) = room()? else { return Ok(()) };
            let need = Room::of_tree(tree, block);
            if free.holds(need) {
                return Ok(());
            }
            let Some((name, _)) = self.superseded.pop_front() else {
                return Err(WriteError::NoRoom { path: self.dir.clone(), need, free, total });
            };
            let path = self.dir.join(&name);
            if is_our_payload(&path, &name) {
                remove_tree(&path)?;
            }
        }
    }

    /// Take `.ready` away (after a failed write: the tree there is stale), if it
    /// is drafs's own link. The next successful write puts it back.
    pub fn withdraw_ready(&mut self) {
        let link = self.dir.join(crate::model::layout::READY);
        if is_our_link(&link, crate::model::layout::READY) {
            let _ = fs::remove_file(&link);
        }
        self.last = None;
    }

    /// Fail before writing anything if a top-level name is taken by something else.
    fn check_top_level(&self, top: &BTreeSet<String>) -> Result<(), WriteError> {
        for name in top {
            let path = self.dir.join(name);
            if fs::symlink_metadata(&path).is_ok() && !is_our_link(&path, name) {
                return Err(WriteError::Foreign { path, name: name.clone() });
            }
        }
        let data = self.dir.join(DATA_LINK);
        if let Ok(meta) = fs::symlink_metadata(&data)
            && !meta.file_type().is_symlink()
        {
            return Err(WriteError::Foreign { path: data, name: String::new() });
        }
        Ok(())
    }

    /// A new symlink to `target` under a name nobody uses.
    fn fresh_link(&self, target: &str) -> Result<PathBuf, WriteError> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        for attempt in 0u32.. {
            let tmp = self.dir.join(format!("..data_tmp.{nanos}.{}.{attempt}", std::process::id()));
            match symlink(target, &tmp) {
                Ok(()) => return Ok(tmp),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => continue,
                Err(e) => return Err(io_err("create symlink", &tmp)(e)),
            }
        }
        unreachable!("the loop returns")
    }

    fn new_payload_dir(&self) -> Result<String, WriteError> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        for attempt in 0u32.. {
            let name = format!("..{nanos}.{}.{attempt}", std::process::id());
            let path = self.dir.join(&name);
            match fs::create_dir(&path) {
                Ok(()) => return Ok(name),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => continue,
                Err(e) => return Err(io_err("create directory", &path)(e)),
            }
        }
        unreachable!("the loop returns")
    }
}

/// The payload `..data` points at, if it is a name drafs could have made.
fn current_payload(dir: &Path) -> Option<String> {
    let target = fs::read_link(dir.join(DATA_LINK)).ok()?;
    let name = target.to_str()?;
    (name.starts_with("..") && !name.contains('/')).then(|| name.to_string())
}

/// `<nanos>.<pid>.<attempt>`: the stamp drafs puts in the names it creates.
fn is_stamp(rest: &str) -> bool {
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `..<nanos>.<pid>.<attempt>`, a real directory (not a link), with the marker.
fn is_our_payload(path: &Path, name: &str) -> bool {
    name.strip_prefix("..").is_some_and(is_stamp)
        && fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_dir())
        && fs::symlink_metadata(path.join(PAYLOAD_MARKER)).is_ok_and(|m| m.file_type().is_file())
}

/// A swap link a killed writer left: `..data_tmp.<n>.<n>.<n>` pointing at a payload name.
fn is_our_swap_link(path: &Path, name: &str) -> bool {
    name.strip_prefix("..data_tmp.").is_some_and(is_stamp)
        && fs::read_link(path).is_ok_and(|t| t.to_str().is_some_and(|t| t.starts_with("..") && !t.contains('/')))
}

fn is_our_link(path: &Path, name: &str) -> bool {
    fs::read_link(path).is_ok_and(|target| target == Path::new(DATA_LINK).join(name))
}

fn write_payload(root: &Path, tree: &Tree) -> Result<(), WriteError> {
    let marker = root.join(PAYLOAD_MARKER);
    fs::write(&marker, "").map_err(io_err("write", &marker))?;
    let dirs = tree.dirs();
    for dir in dirs.iter().filter(|d| !d.is_empty()) {
        let path = root.join(dir);
        fs::create_dir(&path).map_err(io_err("create directory", &path))?;
    }
    for (rel, content) in tree.files() {
        let path = root.join(rel);
        fs::write(&path, content).map_err(io_err("write", &path))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).map_err(io_err("chmod", &path))?;
    }
    for dir in dirs.iter().rev() {
        let path = root.join(dir);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o555)).map_err(io_err("chmod", &path))?;
    }
    Ok(())
}

/// Remove a payload directory; its read-only directories are made writable first
/// so that an unprivileged process can remove what it wrote.
pub fn remove_tree(path: &Path) -> Result<(), WriteError> {
    fn unlock(path: &Path) {
        if fs::set_permissions(path, fs::Permissions::from_mode(0o755)).is_ok()
            && let Ok(entries) = fs::read_dir(path)
        {
            for entry in entries.flatten() {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    unlock(&entry.path());
                }
            }
        }
    }
    unlock(path);
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", path)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(entries: &[(&str, &str)]) -> Tree {
        Tree::from_pairs(entries)
    }

    fn payload_dirs(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA_LINK)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_swaps_and_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dra");
        let mut w = AtomicDir::new(&dir);
        assert!(w.write(&tree(&[("gpu/gpu/0/uuid", "A"), (".ready", "")])).unwrap());
        assert_eq!(fs::read_to_string(dir.join("gpu/gpu/0/uuid")).unwrap(), "A");
        assert!(dir.join(".ready").exists());
        let mode = fs::metadata(dir.join("gpu/gpu/0/uuid")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444);
        let mode = fs::metadata(dir.join("gpu/gpu/0")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o555);
        assert_eq!(payload_dirs(&dir).len(), 1);

        assert!(!w.write(&tree(&[("gpu/gpu/0/uuid", "A"), (".ready", "")])).unwrap(), "no-op write");
        assert!(w.write(&tree(&[("gpu/gpu/0/uuid", "B")])).unwrap());
        assert_eq!(fs::read_to_string(dir.join("gpu/gpu/0/uuid")).unwrap(), "B");
        assert!(fs::symlink_metadata(dir.join(".ready")).is_err(), ".ready link removed");
        assert_eq!(payload_dirs(&dir).len(), 2, "the old payload is kept for readers still inside it");
        let due = w.next_tidy().expect("a removal is due");
        assert_eq!(w.tidy(due - Duration::from_millis(1)).unwrap(), Some(due), "not before its time");
        assert_eq!(payload_dirs(&dir).len(), 2);
        assert_eq!(w.tidy(due).unwrap(), None);
        assert_eq!(payload_dirs(&dir).len(), 1, "old payload removed once its time is up");

        // A new writer (a restarted process) takes over, keeps the old payload
        // for its readers for as long, then removes it.
        drop(w);
        let mut again = AtomicDir::new(&dir);
        assert!(again.write(&tree(&[("nic/rdma/0/mtu", "9000")])).unwrap());
        assert!(fs::symlink_metadata(dir.join("gpu")).is_err());
        assert_eq!(payload_dirs(&dir).len(), 2);
        again.tidy(Instant::now() + RETENTION.keep_for).unwrap();
        assert_eq!(payload_dirs(&dir).len(), 1);
    }

    /// A reader that entered the tree before a swap (its working directory,
    /// a walk, an open directory) reads the old tree whole, not a vanished one.
    #[test]
    fn a_reader_inside_the_tree_keeps_reading_it_across_swaps() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dra");
        let mut w = AtomicDir::new(&dir);
        w.write(&tree(&[("gpu/gpu/0/uuid", "A"), ("gpu/gpu/0/productName", "H200")])).unwrap();
        // Where `cd /dra/gpu/gpu/0` lands: inside the payload, through ..data.
        let inside = fs::canonicalize(dir.join("gpu/gpu/0")).unwrap();
        let open_dir = fs::File::open(&inside).unwrap();
        w.write(&tree(&[("gpu/gpu/0/uuid", "A"), ("gpu/gpu/0/productName", "H200"), ("gpu/gpu/0/.health", "ok")]))
            .unwrap();
        assert_eq!(fs::read_to_string(inside.join("uuid")).unwrap(), "A");
        assert_eq!(fs::read_to_string(inside.join("productName")).unwrap(), "H200");
        let listed: Vec<_> = fs::read_dir(&inside).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(listed.len(), 2, "the old tree, whole: {listed:?}");
        drop(open_dir);
        assert_eq!(fs::read_to_string(dir.join("gpu/gpu/0/.health")).unwrap(), "ok", "new readers see the new tree");
    }

    /// A reader inside a payload keeps it for `at_least` however fast the trees
    /// come (apps that walk their tree at start while a driver changes its
    /// devices every few hundred milliseconds); then only the newest `at_most`
    /// stay, and after `keep_for` none.
    #[test]
    fn a_reader_keeps_its_tree_whatever_the_churn() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dra");
        let mut w = AtomicDir::new(&dir);
        let mut insides = Vec::new();
        let first = Instant::now();
        for i in 0..10 {
            w.write(&tree(&[("gpu/gpu/0/uuid", &format!("v{i}"))])).unwrap();
            insides.push(fs::canonicalize(dir.join("gpu/gpu/0")).unwrap());
        }
        for (i, inside) in insides.iter().enumerate() {
            assert_eq!(fs::read_to_string(inside.join("uuid")).unwrap(), format!("v{i}"), "the tree of write {i}");
        }
        w.tidy(first + RETENTION.at_least + Duration::from_secs(1)).unwrap();
        assert_eq!(payload_dirs(&dir).len(), RETENTION.at_most + 1, "{:?}", payload_dirs(&dir));
        for (i, inside) in insides.iter().enumerate() {
            let kept = i + RETENTION.at_most + 1 >= insides.len();
            assert_eq!(inside.exists(), kept, "the tree of write {i}: only the newest superseded ones are kept");
        }
        assert_eq!(w.next_tidy(), Some(w.superseded[0].1 + RETENTION.keep_for));
        w.tidy(first + RETENTION.keep_for + Duration::from_secs(1)).unwrap();
        assert_eq!(payload_dirs(&dir).len(), 1, "the current tree alone");
        assert_eq!(w.next_tidy(), None);
    }

    /// Past the ceiling the oldest payload goes at once, however young.
    #[test]
    fn superseded_payloads_never_exceed_the_ceiling() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dra");
        let mut w = AtomicDir::new(&dir).with_retention(Retention { ceiling: 3, ..RETENTION });
        let mut insides = Vec::new();
        for i in 0..10 {
            w.write(&tree(&[("gpu/gpu/0/uuid", &format!("v{i}"))])).unwrap();
            insides.push(fs::canonicalize(dir.join("gpu/gpu/0")).unwrap());
            assert!(payload_dirs(&dir).len() <= 3 + 1, "after write {i}: {:?}", payload_dirs(&dir));
        }
        assert_eq!(payload_dirs(&dir).len(), 3 + 1);
        assert!(!insides[0].exists() && insides[6].exists(), "the oldest go first");
    }

    #[test]
    fn one_writer_per_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dra");
        let mut first = AtomicDir::open(&dir).unwrap();
        assert!(first.write(&tree(&[("gpu/gpu/0/uuid", "A")])).unwrap());
        let mut second = AtomicDir::new(&dir);
        let err = second.write(&tree(&[("gpu/gpu/0/uuid", "B")])).unwrap_err();
        assert!(matches!(err, WriteError::Busy { .. }), "{err}");
        assert!(matches!(AtomicDir::open(&dir).unwrap_err(), WriteError::Busy { .. }));
        assert_eq!(fs::read_to_string(dir.join("gpu/gpu/0/uuid")).unwrap(), "A", "the first writer's tree is intact");
        assert_eq!(payload_dirs(&dir).len(), 1, "the refused writer left nothing");
        drop(first);
        assert!(second.write(&tree(&[("gpu/gpu/0/uuid", "B")])).unwrap());
        assert_eq!(fs::read_to_string(dir.join("gpu/gpu/0/uuid")).unwrap(), "B");
    }

    /// A reader that sees `.ready` must see the whole tree (docs/tree.md): on
    /// the first write, and when a later write makes the tree ready.
    #[test]
    fn ready_never_appears_before_the_tree() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Barrier};
        let ready_tree = tree(&[
            (".json", "{}"),
            (".ready", ""),
            ("gpu/gpu/0/uuid", "A"),
            ("nics/rdma/0/mtu", "9000"),
            ("zz/z/0/last", "z"),
        ]);
        let waiting = tree(&[(".json", "{}"), ("gpu/gpu/0/uuid", "A")]);
        let mut early = 0;
        for round in 0..100 {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("dra");
            fs::create_dir(&dir).unwrap();
            let mut w = AtomicDir::new(&dir);
            if round % 2 == 1 {
                w.write(&waiting).unwrap();
            }
            let (start, done) = (Arc::new(Barrier::new(2)), Arc::new(AtomicBool::new(false)));
            let reader = {
                let (dir, start, done) = (dir.clone(), start.clone(), done.clone());
                std::thread::spawn(move || {
                    start.wait();
                    loop {
                        let finished = done.load(Ordering::Acquire);
                        if dir.join(".ready").exists() {
                            return dir.join("nics/rdma/0/mtu").exists() && dir.join("zz/z/0/last").exists();
                        }
                        if finished {
                            return true;
                        }
                    }
                })
            };
            start.wait();
            w.write(&ready_tree).unwrap();
            done.store(true, Ordering::Release);
            if !reader.join().unwrap() {
                early += 1;
            }
        }
        assert_eq!(early, 0, "rounds in which .ready was there before the tree");
    }

    /// A new top-level name appears with the rest of the new tree, never after it.
    #[test]
    fn a_new_top_level_name_appears_with_the_new_tree() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Barrier};
        let before = tree(&[(".json", "1"), ("gpu/gpu/0/uuid", "A")]);
        let after = tree(&[(".json", "2"), ("gpu/gpu/0/uuid", "A"), ("nics/rdma/0/mtu", "9000")]);
        let mut mixed = 0;
        for _ in 0..100 {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("dra");
            let mut w = AtomicDir::new(&dir);
            w.write(&before).unwrap();
            let (start, done) = (Arc::new(Barrier::new(2)), Arc::new(AtomicBool::new(false)));
            let reader = {
                let (dir, start, done) = (dir.clone(), start.clone(), done.clone());
                std::thread::spawn(move || {
                    start.wait();
                    loop {
                        let finished = done.load(Ordering::Acquire);
                        if fs::read_to_string(dir.join(".json")).is_ok_and(|j| j == "2") {
                            return dir.join("nics/rdma/0/mtu").exists();
                        }
                        if finished {
                            return true;
                        }
                    }
                })
            };
            start.wait();
            w.write(&after).unwrap();
            done.store(true, Ordering::Release);
            if !reader.join().unwrap() {
                mixed += 1;
            }
        }
        assert_eq!(mixed, 0, "rounds in which the new .json was there without the new claim");
    }

    #[test]
    fn refuses_foreign_entries_without_writing() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("gpu"), "mine").unwrap();
        let mut w = AtomicDir::new(tmp.path());
        let err = w.write(&tree(&[("gpu/gpu/0/uuid", "A")])).unwrap_err();
        assert!(matches!(err, WriteError::Foreign { .. }), "{err}");
        assert_eq!(fs::read_to_string(tmp.path().join("gpu")).unwrap(), "mine");
        assert!(payload_dirs(tmp.path()).is_empty());
        assert!(fs::symlink_metadata(tmp.path().join(DATA_LINK)).is_err());
    }
}
