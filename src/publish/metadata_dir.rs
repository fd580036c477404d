//! The standard view on disk: stable directories, one file replaced at a time,
//! and the files of drivers that write their own left alone.
//!
//! The tree (`files.rs`) is swapped as a whole through a `..data` link. The
//! standard view cannot be: a driver that writes its own KEP-5304 metadata gets
//! its file bind-mounted by the container runtime at the same paths, and the
//! runtime resolves that mount through any symlink on the way, landing it on
//! drafs's file inside a payload directory that the next swap hides. So here
//! directories are real and never move, each file is replaced by one `rename`
//! (a reader sees the old file or the new one, as with the kubelet's own
//! metadata files), nothing is ever removed, and for a driver named as writing
//! its own metadata drafs only makes sure the mount point exists (an empty
//! file, so the runtime need not create it on the read-only volume) and never
//! writes, replaces or removes it. Nothing is followed through a symlink, and
//! an entry drafs did not make (a symlink, a device, a directory where a file
//! goes) stops the write before anything is written.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use crate::model::metadata::Generations;
use crate::model::tree::Tree;
use crate::publish::files::DirTurns;

/// Files are small (one claim's devices); anything bigger is not drafs's.
const MAX_FILE: u64 = 4 << 20;
const FILE_SUFFIX: &str = "-metadata.json";

#[derive(Debug, thiserror::Error)]
pub enum MetadataDirError {
    #[error("cannot {op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: io::Error },
    #[error(
        "refusing to write {path}: it exists and is not a {expected} drafs made (a symlink, device or other foreign entry)"
    )]
    Foreign { path: PathBuf, expected: &'static str },
    /// Another drafs writes the directory (or it cannot be made or opened).
    #[error(transparent)]
    Lock(#[from] crate::publish::files::WriteError),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> MetadataDirError + 'a {
    move |source| MetadataDirError::Io { op, path: path.to_path_buf(), source }
}

/// The driver a standard-view file belongs to: `<driver>-metadata.json`.
pub fn file_driver(rel: &str) -> Option<&str> {
    rel.rsplit('/').next()?.strip_suffix(FILE_SUFFIX)
}

/// Read a regular file without following a symlink or blocking on a FIFO, up to
/// `MAX_FILE` bytes; `None` for anything else.
pub fn read_regular(path: &Path) -> Option<Vec<u8>> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.file_type().is_file() || meta.len() > MAX_FILE {
        return None;
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_FILE + 1).read_to_end(&mut out).ok()?;
    (out.len() as u64 <= MAX_FILE).then_some(out)
}

/// The drivers that write their own standard-view files, shared by a writer
/// and whoever learns of more while it runs (the node agent learns them from
/// a container's mounts, at its creation).
pub type DriverOwned = Arc<std::sync::Mutex<BTreeSet<String>>>;

/// Writes the standard view into one directory.
#[derive(Debug)]
pub struct MetadataDir {
    dir: PathBuf,
    /// Drivers that write their own files: drafs leaves those paths to them.
    driver_owned: DriverOwned,
    /// What drafs last wrote at each path, to skip unchanged files.
    written: BTreeMap<String, Vec<u8>>,
    /// One writer per directory, as for the tree (held, or lent by the node
    /// agent's volume to each of its runs in turn).
    lock: Option<Arc<DirTurns>>,
}

impl MetadataDir {
    pub fn new(dir: impl Into<PathBuf>, driver_owned: impl IntoIterator<Item = String>) -> Self {
        let owned = Arc::new(std::sync::Mutex::new(driver_owned.into_iter().collect()));
        MetadataDir { dir: dir.into(), driver_owned: owned, written: BTreeMap::new(), lock: None }
    }

    /// Write into a directory whose lock the caller holds, leaving to the
    /// drivers in `owned` (which the caller may add to) their files.
    pub fn sharing_owners(dir: impl Into<PathBuf>, owned: DriverOwned, turns: Arc<DirTurns>) -> Self {
        MetadataDir { dir: dir.into(), driver_owned: owned, written: BTreeMap::new(), lock: Some(turns) }
    }

    /// Take the directory for this writer now if it exists (a second writer is
    /// refused at start); one that does not exist yet is taken at the first write.
    pub fn open(
        dir: impl Into<PathBuf>,
        driver_owned: impl IntoIterator<Item = String>,
    ) -> Result<Self, MetadataDirError> {
        let mut out = Self::new(dir, driver_owned);
        if out.dir.is_dir() {
            out.lock = Some(DirTurns::take(&out.dir)?);
        }
        Ok(out)
    }

    /// Write into a directory whose lock the caller holds and lends to each
    /// of its writers in turn (the node agent's standard-view volume).
    pub fn taking_turns(
        dir: impl Into<PathBuf>,
        driver_owned: impl IntoIterator<Item = String>,
        turns: Arc<DirTurns>,
    ) -> Self {
        MetadataDir { lock: Some(turns), ..Self::new(dir, driver_owned) }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn owned_by_driver(&self, rel: &str) -> bool {
        let owned = self.driver_owned.lock().unwrap_or_else(|e| e.into_inner());
        file_driver(rel).is_some_and(|d| owned.contains(d))
    }

    /// Every directory of `rel` below the root, and the file itself, as
    /// drafs would find or make them: an error for anything foreign.
    fn check(&self, rel: &str) -> Result<(), MetadataDirError> {
        let mut path = self.dir.clone();
        let parts: Vec<&str> = rel.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            path.push(part);
            let last = i + 1 == parts.len();
            match fs::symlink_metadata(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(io_err("inspect", &path)(e)),
                Ok(m) if last && m.file_type().is_file() => {}
                Ok(m) if !last && m.file_type().is_dir() => {}
                Ok(_) => {
                    return Err(MetadataDirError::Foreign {
                        path,
                        expected: if last { "regular file" } else { "directory" },
                    });
                }
            }
        }
        Ok(())
    }

    /// Write every file of `view` that changed; returns whether anything was
    /// written. Every path is checked before the first write.
    pub fn write(&mut self, view: &Tree) -> Result<bool, MetadataDirError> {
        let files: Vec<(&str, &[u8])> = view.files().collect();
        match fs::symlink_metadata(&self.dir) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => return Err(MetadataDirError::Foreign { path: self.dir.clone(), expected: "directory" }),
            // Outside a pod (a local run), as the tree's directory is.
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&self.dir)
                .map_err(io_err("create directory", &self.dir))?,
            Err(e) => return Err(io_err("open", &self.dir)(e)),
        }
        if self.lock.is_none() {
            self.lock = Some(DirTurns::take(&self.dir)?);
        }
        let turns = self.lock.clone().expect("locked above");
        let _turn = turns.turn();
        for (rel, content) in &files {
            if self.owned_by_driver(rel) || self.written.get(*rel).map(Vec::as_slice) != Some(*content) {
                self.check(rel)?;
            }
        }
        let mut wrote = false;
        for (rel, content) in files {
            if self.written.get(rel).map(Vec::as_slice) == Some(content) {
                continue;
            }
            let path = self.dir.join(rel);
            let parent = path.parent().expect("a file of the view has a parent").to_path_buf();
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&parent)
                .map_err(io_err("create directory", &parent))?;
            // Made by someone else between the check and now: still not followed.
            self.check(rel)?;
            if self.owned_by_driver(rel) {
                // The driver's mount point: made once, empty, never written.
                match fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o444)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&path)
                {
                    Ok(_) => wrote = true,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_err("create", &path)(e)),
                }
                self.written.insert(rel.to_string(), content.to_vec());
                continue;
            }
            // A restarted drafs finds its own last file: no need to replace it.
            if read_regular(&path).is_some_and(|old| old == content) {
                self.written.insert(rel.to_string(), content.to_vec());
                continue;
            }
            let name = path.file_name().expect("a file of the view has a name").to_string_lossy().into_owned();
            let tmp = parent.join(format!(".{name}.drafs-tmp"));
            // A temporary file of a drafs killed mid-write: only a regular file is removed.
            if fs::symlink_metadata(&tmp).is_ok_and(|m| m.file_type().is_file()) {
                fs::remove_file(&tmp).map_err(io_err("remove", &tmp))?;
            }
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o444)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)
                .map_err(io_err("create", &tmp))?;
            let written = file.write_all(content).map_err(io_err("write", &tmp));
            drop(file);
            if let Err(e) = written.and_then(|()| fs::rename(&tmp, &path).map_err(io_err("rename", &path))) {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
            self.written.insert(rel.to_string(), content.to_vec());
            wrote = true;
        }
        Ok(wrote)
    }
}

/// Read back the generation and content of drafs's files under `dir`, so a
/// restart (or `serve` after `init`) goes on counting.
///
/// Bounded, so that whatever is in the directory cannot stall start-up:
/// only the standard layout's depth (`<kind>/<claim>/<request>/<file>`),
/// never through a symlink, only regular files of bounded size, and at
/// most `MAX_READ_BACK` entries in all.
pub fn read_generations(dir: &Path) -> Generations {
    const MAX_READ_BACK: usize = 10_000;
    let mut out = Generations::default();
    let mut seen = 0usize;
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_READ_BACK {
                return out;
            }
            // The entry's own type: a symlink is never followed.
            let Ok(kind) = entry.file_type() else { continue };
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if kind.is_dir() && depth < 3 && !name.starts_with('.') {
                stack.push((path, depth + 1));
            } else if kind.is_file()
                && depth == 3
                && name.ends_with("-metadata.json")
                && let Some(bytes) = read_regular(&path)
                && let Ok(text) = String::from_utf8(bytes)
                && let Some(first) = text.lines().next()
                && let Ok(rel) = path.strip_prefix(dir)
            {
                out.take_back(rel.to_string_lossy().into_owned(), first);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::metadata::build;
    use serde_json::Value;
    use std::os::unix::fs::{MetadataExt, symlink};

    const A: &str = "resourceclaims/c/r/a.example.com-metadata.json";
    const B: &str = "resourceclaimtemplates/p/r/b.example.com-metadata.json";

    fn view(a: &str, b: &str) -> Tree {
        Tree::from_pairs(&[(A, a), (B, b)])
    }

    #[test]
    fn generations_are_read_back_so_another_process_goes_on_counting() {
        let res = crate::model::metadata::tests::example();
        let (mut generations, mut warnings) = (Generations::default(), vec![]);
        build(&res, &mut generations, &mut warnings);
        let mut changed = res.clone();
        changed.claims[0].devices[0].device = "other".into();
        let next = build(&changed, &mut generations, &mut warnings);
        let tmp = tempfile::tempdir().unwrap();
        // Another process on the same directory goes on counting from it.
        MetadataDir::new(tmp.path(), []).write(&next).unwrap();
        let mut read_back = read_generations(tmp.path());
        let same = build(&changed, &mut read_back, &mut warnings);
        assert_eq!(same, next, "same content: the generation read back, not 1");
        let again = build(&res, &mut read_back, &mut warnings);
        let text = std::str::from_utf8(again.get("resourceclaims/direct/pgpu/gpu.example.com-metadata.json").unwrap())
            .unwrap();
        let doc: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(doc["metadata"]["generation"], 3);
    }

    #[test]
    fn replaces_changed_files_in_place_and_keeps_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let mut dir = MetadataDir::new(tmp.path(), []);
        assert!(dir.write(&view("1", "x")).unwrap());
        let request_dir = fs::metadata(tmp.path().join("resourceclaims/c/r")).unwrap().ino();
        let b_inode = fs::metadata(tmp.path().join(B)).unwrap().ino();
        assert!(!dir.write(&view("1", "x")).unwrap(), "nothing changed, nothing written");
        assert!(dir.write(&view("2", "x")).unwrap());
        assert_eq!(fs::read_to_string(tmp.path().join(A)).unwrap(), "2");
        // The directories a runtime's bind mount lands in never move; an unchanged file is not replaced.
        assert_eq!(fs::metadata(tmp.path().join("resourceclaims/c/r")).unwrap().ino(), request_dir);
        assert_eq!(fs::metadata(tmp.path().join(B)).unwrap().ino(), b_inode);
        assert!(!tmp.path().join("resourceclaims/c/r/.a.example.com-metadata.json.drafs-tmp").exists());
        // No symlink anywhere (a runtime would resolve a mount through it).
        for entry in ["resourceclaims", "resourceclaims/c", "resourceclaims/c/r", A] {
            assert!(!fs::symlink_metadata(tmp.path().join(entry)).unwrap().file_type().is_symlink(), "{entry}");
        }
    }

    #[test]
    fn a_driver_that_writes_its_own_file_gets_only_an_empty_mount_point() {
        let tmp = tempfile::tempdir().unwrap();
        let mut dir = MetadataDir::new(tmp.path(), ["b.example.com".to_string()]);
        dir.write(&view("1", "drafs's view of b")).unwrap();
        assert_eq!(fs::read_to_string(tmp.path().join(B)).unwrap(), "", "only the mount point");
        // What is there (the driver's mount seen from outside, or anything) is never replaced.
        fs::set_permissions(tmp.path().join(B), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        fs::write(tmp.path().join(B), "the driver's").unwrap();
        let inode = fs::metadata(tmp.path().join(B)).unwrap().ino();
        dir.write(&view("2", "drafs's newer view of b")).unwrap();
        drop(dir); // a restarted drafs: the lock went with the first
        let mut fresh = MetadataDir::new(tmp.path(), ["b.example.com".to_string()]);
        fresh.write(&view("3", "and again")).unwrap();
        assert_eq!(fs::read_to_string(tmp.path().join(B)).unwrap(), "the driver's");
        assert_eq!(fs::metadata(tmp.path().join(B)).unwrap().ino(), inode);
        assert_eq!(fs::read_to_string(tmp.path().join(A)).unwrap(), "3");
    }

    #[test]
    fn refuses_foreign_entries_before_writing_anything() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        // A symlink where a directory goes (an older layout, or an attacker's link out of the volume).
        symlink(outside.path(), tmp.path().join("resourceclaimtemplates")).unwrap();
        let mut dir = MetadataDir::new(tmp.path(), []);
        let err = dir.write(&view("1", "x")).unwrap_err();
        assert!(matches!(err, MetadataDirError::Foreign { .. }), "{err}");
        assert!(err.to_string().contains("resourceclaimtemplates"), "{err}");
        assert!(!tmp.path().join("resourceclaims").exists(), "nothing half-written");
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0, "nothing written through the link");
        // A symlink where the file goes is not written through either.
        fs::remove_file(tmp.path().join("resourceclaimtemplates")).unwrap();
        fs::create_dir_all(tmp.path().join("resourceclaimtemplates/p/r")).unwrap();
        symlink(outside.path().join("target"), tmp.path().join(B)).unwrap();
        assert!(dir.write(&view("1", "x")).is_err());
        assert!(!outside.path().join("target").exists());
    }

    #[test]
    fn reads_only_bounded_regular_files() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("f"), "ok").unwrap();
        symlink(tmp.path().join("f"), tmp.path().join("link")).unwrap();
        symlink("/dev/zero", tmp.path().join("zero")).unwrap();
        assert_eq!(read_regular(&tmp.path().join("f")).unwrap(), b"ok");
        assert!(read_regular(&tmp.path().join("link")).is_none());
        assert!(read_regular(&tmp.path().join("zero")).is_none());
        assert!(read_regular(Path::new("/dev/zero")).is_none());
        assert!(read_regular(tmp.path()).is_none());
    }
}
