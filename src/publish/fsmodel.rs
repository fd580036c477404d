//! The filesystem model behind the FUSE backend, tested without a mount.
//!
//! A [`FsSnapshot`] is an immutable inode table built from a [`Tree`]. The FUSE
//! adapter answers every request from the current snapshot and swaps in a new one
//! on change; [`invalidations`] says which kernel caches must then be dropped.
//! Inode numbers come from an [`InodeAllocator`] that lives as long as the mount:
//! a directory keeps its inode while its path exists, and a file keeps its inode
//! while its path exists *and its content is unchanged*. A changed file gets a
//! new inode, so an inode's content never changes: whatever the kernel cached
//! about an inode (size, pages) stays true of it, and a reader sees the old
//! value or the new one, never the new bytes cut to the old size. The
//! allocator remembers only the current paths.
//!
//! [`KernelRefs`] is what the kernel may still ask about: the inodes it looked
//! up, and the nodes a swap replaced that it may still read, within bounds.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::model::tree::Tree;

pub type Ino = u64;
pub const ROOT: Ino = 1;

/// A lookup or read that cannot be answered, with the errno the kernel gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
}

impl FsError {
    pub fn errno(self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Dir,
    File,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub ino: Ino,
    pub kind: Kind,
    pub parent: Ino,
    /// When this node's content last changed.
    pub mtime: SystemTime,
    pub content: Arc<[u8]>,
    pub children: BTreeMap<String, Ino>,
}

impl Node {
    pub fn size(&self) -> u64 {
        self.content.len() as u64
    }

    /// Files 0444, directories 0555: readable by any uid, writable by none.
    pub fn perm(&self) -> u16 {
        match self.kind {
            Kind::Dir => 0o555,
            Kind::File => 0o444,
        }
    }
}

/// Inode numbers for the life of the mount (see the module doc).
#[derive(Debug)]
pub struct InodeAllocator {
    /// The inode of every path of the last snapshot built.
    by_path: HashMap<(String, Kind), Ino>,
    next: Ino,
}

impl Default for InodeAllocator {
    fn default() -> Self {
        let mut by_path = HashMap::new();
        by_path.insert((String::new(), Kind::Dir), ROOT);
        InodeAllocator { by_path, next: ROOT + 1 }
    }
}

impl InodeAllocator {
    fn fresh(&mut self) -> Ino {
        let ino = self.next;
        self.next += 1;
        ino
    }

    /// Paths remembered (the current snapshot's).
    pub fn len(&self) -> usize {
        self.by_path.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_path.is_empty()
    }
}

/// An immutable view of the tree as inodes.
#[derive(Debug, Clone)]
pub struct FsSnapshot {
    nodes: HashMap<Ino, Node>,
}

fn parent_of(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

impl FsSnapshot {
    /// An empty root directory (mounted before the first resolution).
    pub fn empty() -> Self {
        Self::build(&Tree::default(), &mut InodeAllocator::default(), None)
    }

    /// Build from a tree; nodes whose content did not change since `previous`
    /// keep their mtime.
    pub fn build(tree: &Tree, inodes: &mut InodeAllocator, previous: Option<&FsSnapshot>) -> Self {
        let now = SystemTime::now();
        let mut nodes: HashMap<Ino, Node> = HashMap::new();
        let empty: Arc<[u8]> = Arc::from(Vec::new());
        let dirs = tree.dirs();
        let entries = dirs.iter().map(|d| (d.as_str(), Kind::Dir, empty.clone()));
        let entries = entries.chain(tree.files().map(|(p, c)| (p, Kind::File, Arc::from(c))));
        let mut by_path: HashMap<(String, Kind), Ino> = HashMap::new();
        by_path.insert((String::new(), Kind::Dir), ROOT);
        // (path, kind, content, inode, mtime kept from the previous snapshot)
        type Placed<'t> = (&'t str, Kind, Arc<[u8]>, Ino, Option<SystemTime>);
        let mut inos: Vec<Placed> = Vec::new();
        for (path, kind, content) in entries {
            let key = (path.to_string(), kind);
            // Reuse the path's inode if it still says the same (a directory always does).
            let kept = inodes.by_path.get(&key).copied().and_then(|ino| {
                let old = previous.and_then(|p| p.nodes.get(&ino));
                match old {
                    Some(old) if old.kind == kind && (kind == Kind::Dir || old.content == content) => {
                        Some((ino, Some(old.mtime)))
                    }
                    None if path.is_empty() => Some((ROOT, None)),
                    _ => None,
                }
            });
            let (ino, mtime) = match kept {
                Some(found) => found,
                None if path.is_empty() => (ROOT, None),
                None => (inodes.fresh(), None),
            };
            by_path.insert(key, ino);
            inos.push((path, kind, content, ino, mtime));
        }
        let mut links: Vec<(Ino, &str, Ino)> = Vec::new();
        for (path, kind, content, ino, mtime) in inos {
            let (parent_path, name) = parent_of(path);
            let parent = if path.is_empty() { ROOT } else { by_path[&(parent_path.to_string(), Kind::Dir)] };
            if !path.is_empty() {
                links.push((parent, name, ino));
            }
            nodes.insert(
                ino,
                Node { ino, kind, parent, mtime: mtime.unwrap_or(now), content, children: BTreeMap::new() },
            );
        }
        inodes.by_path = by_path;
        for (parent, name, ino) in links {
            if let Some(p) = nodes.get_mut(&parent) {
                p.children.insert(name.to_string(), ino);
            }
        }
        // A directory's mtime follows its entries.
        let changed_dirs: Vec<Ino> = nodes
            .values()
            .filter(|n| n.kind == Kind::Dir)
            .filter(|n| previous.and_then(|p| p.nodes.get(&n.ino)).is_none_or(|old| old.children != n.children))
            .map(|n| n.ino)
            .collect();
        for ino in changed_dirs {
            if let Some(n) = nodes.get_mut(&ino) {
                n.mtime = now;
            }
        }
        FsSnapshot { nodes }
    }

    pub fn node(&self, ino: Ino) -> Option<&Node> {
        self.nodes.get(&ino)
    }

    pub fn inodes(&self) -> impl Iterator<Item = Ino> + '_ {
        self.nodes.keys().copied()
    }

    /// Inodes in the snapshot, directories included (statfs reports it).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> Result<&Node, FsError> {
        let dir = self.nodes.get(&parent).ok_or(FsError::NotFound)?;
        if dir.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let ino = match name {
            "." => parent,
            ".." => dir.parent,
            _ => *dir.children.get(name).ok_or(FsError::NotFound)?,
        };
        self.nodes.get(&ino).ok_or(FsError::NotFound)
    }

    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<&[u8], FsError> {
        let node = self.nodes.get(&ino).ok_or(FsError::NotFound)?;
        if node.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let start = (offset as usize).min(node.content.len());
        let end = start.saturating_add(size as usize).min(node.content.len());
        Ok(&node.content[start..end])
    }

    /// Entries of a directory, `.` and `..` first.
    pub fn readdir(&self, ino: Ino) -> Result<Vec<(Ino, Kind, String)>, FsError> {
        let dir = self.nodes.get(&ino).ok_or(FsError::NotFound)?;
        if dir.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let mut out = vec![(ino, Kind::Dir, ".".to_string()), (dir.parent, Kind::Dir, "..".to_string())];
        for (name, child) in &dir.children {
            if let Some(node) = self.nodes.get(child) {
                out.push((*child, node.kind, name.clone()));
            }
        }
        Ok(out)
    }
}

/// A retired node nobody has looked up is dropped after this long (the lookup
/// that raced with its retirement has been counted by then).
pub const RETIRED_GRACE: Duration = Duration::from_secs(2);
/// Older retired nodes kept at most (the oldest are dropped first). The
/// kernel forgets an inode only when it reclaims it, so without a bound a
/// long-running sidecar would keep every value it ever served. A reader would
/// need to hold a file open across this many replaced values, and have its
/// page cache dropped, to miss one (it then gets ESTALE, and a path lookup is
/// retried afresh).
pub const RETIRED_MAX: usize = 1024;
/// Older retired nodes kept at most, in bytes of content: a change replaces
/// the tree's `.json` files too, and 1024 copies of the 24 KB `.json` of 8
/// devices x 30 attributes would be 24 MiB (a health flip replaces it and a
/// 1-byte `.health`: 12 MiB were kept when every flip was read).
pub const RETIRED_MAX_BYTES: usize = 1 << 20;

/// What the kernel holds: how many lookups of each inode it has not forgotten,
/// and the nodes replaced since that it may still read (an open file of a value
/// that has changed reads the value it opened, whole). Bounded: the nodes the
/// last swap replaced, and at most [`RETIRED_MAX`] nodes or
/// [`RETIRED_MAX_BYTES`] of content of older ones.
///
/// B-trees, not hash maps: a hash map keeps the capacity of its largest
/// moment (and grows further under churn), where a B-tree frees what it no
/// longer holds (an 8-device tree's churn left 840 KiB of empty hash buckets).
#[derive(Debug, Default)]
pub struct KernelRefs {
    lookups: BTreeMap<Ino, u64>,
    retired: BTreeMap<Ino, (Node, Instant)>,
}

impl KernelRefs {
    /// The kernel looked `ino` up once more.
    pub fn looked_up(&mut self, ino: Ino) {
        *self.lookups.entry(ino).or_default() += 1;
    }

    /// The kernel forgot `n` lookups of `ino`; a retired node it no longer holds is dropped.
    pub fn forget(&mut self, ino: Ino, n: u64) {
        let left = self.lookups.get(&ino).map_or(0, |count| count.saturating_sub(n));
        if left == 0 {
            self.lookups.remove(&ino);
            self.retired.remove(&ino);
        } else {
            self.lookups.insert(ino, left);
        }
    }

    /// A node replaced by a swap and still kept.
    pub fn retired(&self, ino: Ino) -> Option<&Node> {
        self.retired.get(&ino).map(|(node, _)| node)
    }

    /// `new` replaces `old` at `now`: keep the nodes it replaces (call before
    /// the swap, so that no request misses them), drop those the kernel no
    /// longer needs, and the oldest beyond the bounds.
    pub fn retire(&mut self, old: &FsSnapshot, new: &FsSnapshot, now: Instant) {
        let KernelRefs { lookups, retired } = self;
        retired.retain(|ino, (_, since)| lookups.contains_key(ino) || now.duration_since(*since) < RETIRED_GRACE);
        for (ino, node) in &old.nodes {
            if !new.nodes.contains_key(ino) {
                retired.insert(*ino, (node.clone(), now));
            }
        }
        let mut older: Vec<(Instant, Ino, usize)> = retired
            .iter()
            .filter(|(_, (_, since))| *since < now)
            .map(|(ino, (node, since))| (*since, *ino, node.content.len()))
            .collect();
        let (mut count, mut bytes) = (older.len(), older.iter().map(|(.., len)| len).sum::<usize>());
        if count <= RETIRED_MAX && bytes <= RETIRED_MAX_BYTES {
            return;
        }
        older.sort_unstable();
        for (_, ino, len) in older {
            if count <= RETIRED_MAX && bytes <= RETIRED_MAX_BYTES {
                break;
            }
            retired.remove(&ino);
            lookups.remove(&ino);
            count -= 1;
            bytes -= len;
        }
    }

    /// Retired nodes kept, and the bytes of their content.
    pub fn retired_size(&self) -> (usize, usize) {
        (self.retired.len(), self.retired.values().map(|(node, _)| node.content.len()).sum())
    }
}

/// A kernel cache entry to drop after a swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalidation {
    /// Attributes and cached data of an inode (a changed file, a directory whose entries changed).
    Inode(Ino),
    /// A name that now exists (drops a cached negative lookup).
    Entry { parent: Ino, name: String },
    /// A name that no longer exists.
    Deleted { parent: Ino, child: Ino, name: String },
}

/// What the kernel must forget when `new` replaces `old`.
pub fn invalidations(old: &FsSnapshot, new: &FsSnapshot) -> Vec<Invalidation> {
    let mut out = Vec::new();
    for (ino, node) in &new.nodes {
        let Some(before) = old.nodes.get(ino) else { continue };
        if node.kind == Kind::File && before.content != node.content {
            out.push(Invalidation::Inode(*ino));
        }
        if node.kind == Kind::Dir && before.children != node.children {
            for (name, child) in &node.children {
                if before.children.get(name) != Some(child) {
                    out.push(Invalidation::Entry { parent: *ino, name: name.clone() });
                }
            }
            // Only names that are gone are deleted. A name that now leads to
            // another inode (a changed value) is only invalidated (above): a
            // deletion would leave a moment in which an open() finds no file.
            for (name, child) in &before.children {
                if !node.children.contains_key(name) {
                    out.push(Invalidation::Deleted { parent: *ino, child: *child, name: name.clone() });
                }
            }
            out.push(Invalidation::Inode(*ino));
        }
    }
    out.sort_by_key(|i| match i {
        Invalidation::Deleted { .. } => 0,
        Invalidation::Inode(_) => 1,
        Invalidation::Entry { .. } => 2,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(entries: &[(&str, &str)]) -> Tree {
        Tree::from_pairs(entries)
    }

    fn path_ino(s: &FsSnapshot, path: &str) -> Ino {
        path.split('/').fold(ROOT, |dir, name| s.lookup(dir, name).unwrap().ino)
    }

    #[test]
    fn lookup_read_readdir() {
        let mut inodes = InodeAllocator::default();
        let s = FsSnapshot::build(&tree(&[("gpu/gpu/0/uuid", "GPU-1"), (".ready", "")]), &mut inodes, None);
        let uuid = path_ino(&s, "gpu/gpu/0/uuid");
        assert_eq!(s.read(uuid, 0, 4096), Ok(&b"GPU-1"[..]));
        assert_eq!(s.read(uuid, 4, 10), Ok(&b"1"[..]));
        assert_eq!(s.read(uuid, 99, 10), Ok(&b""[..]));
        assert_eq!(s.node(uuid).unwrap().perm(), 0o444);
        assert_eq!(s.lookup(ROOT, "nope").unwrap_err().errno(), libc::ENOENT);
        assert_eq!(s.lookup(uuid, "x").unwrap_err(), FsError::NotDir);
        assert_eq!(s.read(ROOT, 0, 1).unwrap_err(), FsError::IsDir);
        let names: Vec<String> = s.readdir(ROOT).unwrap().into_iter().map(|e| e.2).collect();
        assert_eq!(names, vec![".", "..", ".ready", "gpu"]);
        let gpu = path_ino(&s, "gpu");
        assert_eq!(s.lookup(gpu, "..").unwrap().ino, ROOT);
        assert_eq!(s.node(gpu).unwrap().perm(), 0o555);
    }

    #[test]
    fn a_changed_file_gets_a_new_inode_and_unchanged_paths_keep_theirs() {
        let mut inodes = InodeAllocator::default();
        let a = FsSnapshot::build(
            &tree(&[("gpu/gpu/0/uuid", "A"), ("gpu/gpu/0/bus", "1"), (".ready", "")]),
            &mut inodes,
            None,
        );
        let b = FsSnapshot::build(
            &tree(&[("gpu/gpu/0/uuid", "B"), ("gpu/gpu/0/bus", "1"), ("gpu/gpu/0/new", "n")]),
            &mut inodes,
            Some(&a),
        );
        let uuid = path_ino(&a, "gpu/gpu/0/uuid");
        let new_uuid = path_ino(&b, "gpu/gpu/0/uuid");
        assert_ne!(new_uuid, uuid, "new content, new inode: an inode's content never changes");
        assert_eq!(b.read(new_uuid, 0, 10).unwrap(), b"B");
        assert!(b.node(uuid).is_none(), "the old inode is not in the new snapshot");
        let bus = path_ino(&a, "gpu/gpu/0/bus");
        assert_eq!(path_ino(&b, "gpu/gpu/0/bus"), bus, "same content, same inode");
        assert_eq!(b.node(bus).unwrap().mtime, a.node(bus).unwrap().mtime, "unchanged content keeps mtime");
        let dev = path_ino(&a, "gpu/gpu/0");
        assert_eq!(path_ino(&b, "gpu/gpu/0"), dev, "directories keep their inode");
        let inv = invalidations(&a, &b);
        // The name now leads to another inode: the kernel forgets the old entry,
        // without ever being told the name is gone (an open() would fail then).
        assert!(inv.contains(&Invalidation::Entry { parent: dev, name: "uuid".into() }));
        assert!(!inv.iter().any(|i| matches!(i, Invalidation::Deleted { name, .. } if name == "uuid")));
        assert!(!inv.iter().any(|i| matches!(i, Invalidation::Entry { name, .. } if name == "bus")));
        assert!(inv.contains(&Invalidation::Entry { parent: dev, name: "new".into() }));
        let ready = path_ino(&a, ".ready");
        assert!(inv.contains(&Invalidation::Deleted { parent: ROOT, child: ready, name: ".ready".into() }));
        assert!(inv.contains(&Invalidation::Inode(ROOT)));
        assert_eq!(b.lookup(ROOT, ".ready").unwrap_err(), FsError::NotFound);

        // Only the current paths are remembered, however many have come and gone.
        let c = FsSnapshot::build(&tree(&[(".ready", "")]), &mut inodes, Some(&b));
        assert_ne!(path_ino(&c, ".ready"), ready, "a path that returns gets a fresh inode");
        assert_eq!(inodes.len(), 2, "root and .ready");
        assert!(invalidations(&c, &c).is_empty());
        for i in 0..1000 {
            FsSnapshot::build(&tree(&[(&format!("attr{i}"), "x")]), &mut inodes, Some(&c));
        }
        assert_eq!(inodes.len(), 2);
    }

    /// A tree whose `.json` is `json_kib` KiB and says `health`, as a health flip changes it.
    fn flipped(health: &str, json_kib: usize) -> Tree {
        let json = format!("{{\"health\": \"{health}\", \"pad\": \"{}\"}}", "x".repeat(json_kib * 1024));
        tree(&[("gpu/gpu/0/.health", health), ("gpu/gpu/0/uuid", "GPU-1"), (".json", &json)])
    }

    #[test]
    fn replaced_nodes_are_kept_for_the_kernel_within_bounds() {
        let (mut inodes, mut refs) = (InodeAllocator::default(), KernelRefs::default());
        let mut now = Instant::now();
        let mut current = FsSnapshot::build(&flipped("Healthy", 25), &mut inodes, None);
        // 1,200 health flips, each replacing `.health` and the 25 KiB `.json`;
        // a reader looks up every new value and the kernel never forgets one.
        for i in 0..1200 {
            let next = FsSnapshot::build(&flipped(["Unhealthy", "Healthy"][i % 2], 25), &mut inodes, Some(&current));
            refs.looked_up(path_ino(&next, ".json"));
            refs.looked_up(path_ino(&next, "gpu/gpu/0/.health"));
            let replaced = path_ino(&current, ".json");
            refs.retire(&current, &next, now);
            assert!(refs.retired(replaced).is_some(), "the value just replaced is still readable");
            current = next;
            now += Duration::from_millis(10);
        }
        let (count, bytes) = refs.retired_size();
        let json = 25 * 1024 + 30;
        assert!(bytes <= RETIRED_MAX_BYTES + json, "{bytes} bytes kept in {count} nodes");
        assert!(count <= RETIRED_MAX + 2, "{count}");
        assert!(bytes >= RETIRED_MAX_BYTES - json, "the budget is used: {bytes}");
        assert!(refs.lookups.len() <= RETIRED_MAX + 4, "lookups of dropped nodes go with them: {}", refs.lookups.len());

        // Small values: the count bounds them.
        for i in 0..1200 {
            let next = FsSnapshot::build(&flipped(&format!("h{i}"), 0), &mut inodes, Some(&current));
            refs.looked_up(path_ino(&next, "gpu/gpu/0/.health"));
            refs.retire(&current, &next, now);
            current = next;
            now += Duration::from_millis(10);
        }
        assert!(refs.retired_size().0 <= RETIRED_MAX + 2, "{:?}", refs.retired_size());

        // One value over the whole budget is still kept through its grace.
        let big = FsSnapshot::build(&flipped("Healthy", 2048), &mut inodes, Some(&current));
        refs.retire(&current, &big, now);
        let after = FsSnapshot::build(&flipped("Unhealthy", 0), &mut inodes, Some(&big));
        refs.retire(&big, &after, now + Duration::from_millis(1));
        assert!(refs.retired(path_ino(&big, ".json")).is_some(), "the value just replaced is kept, however large");
        let (_, bytes) = refs.retired_size();
        assert!(bytes <= RETIRED_MAX_BYTES + 2048 * 1024 + 30, "older values within the budget: {bytes}");

        // Nodes nobody looked up are dropped once their grace is over; the
        // kernel's forget drops the others.
        let later = now + RETIRED_GRACE + Duration::from_millis(10);
        refs.retire(&after, &after, later);
        assert!(refs.retired(path_ino(&big, ".json")).is_none());
        let held: Vec<Ino> = refs.retired.keys().copied().collect();
        assert!(!held.is_empty());
        for ino in held {
            refs.forget(ino, u64::MAX);
        }
        assert_eq!(refs.retired_size(), (0, 0));
    }

    #[test]
    fn a_path_that_changes_kind_gets_a_new_inode() {
        let mut inodes = InodeAllocator::default();
        let a = FsSnapshot::build(&tree(&[("x", "file")]), &mut inodes, None);
        let b = FsSnapshot::build(&tree(&[("x/y", "nested")]), &mut inodes, Some(&a));
        assert_ne!(path_ino(&a, "x"), path_ino(&b, "x"));
        assert_eq!(b.node(path_ino(&b, "x")).unwrap().kind, Kind::Dir);
    }
}
