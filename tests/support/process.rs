//! Running the real binary: an environment a pod would give it, waiting
//! with limits, a background `serve` and its FUSE mount, reading what it wrote.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{TestApi, repo_path};

/// The binary under test: `DRAFS_BIN` (benchmarks use it to measure the
/// shipped image binary), nextest's path to it, or cargo's build beside the
/// test binary (`target/<profile>/deps/<test>` → `target/<profile>/drafs`,
/// which cargo builds before any integration test or benchmark).
pub fn drafs_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("DRAFS_BIN").or_else(|| std::env::var_os("NEXTEST_BIN_EXE_drafs")) {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("a test binary lives in target/<profile>/deps");
    profile_dir.join(format!("drafs{}", std::env::consts::EXE_SUFFIX))
}

/// A scratch directory with a kubeconfig pointing at the test API server.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub namespace: String,
    pub pod: String,
}

impl Env {
    pub fn new(api: &TestApi, namespace: &str, pod: &str, token: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: drafs\n    namespace: {namespace}\ncurrent-context: test\nusers:\n- name: drafs\n  user:\n    token: {token}\n",
                api.url()
            ),
        )
        .unwrap();
        // The kubelet provides the termination log file; drafs only writes into it.
        std::fs::write(dir.path().join("termination-log"), "").unwrap();
        Env { dir, kubeconfig, namespace: namespace.into(), pod: pod.into() }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A `drafs` command with the environment a pod would give it.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(drafs_bin());
        cmd.args(args)
            .env_clear()
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.path())
            .env("POD_NAME", &self.pod)
            .env("POD_NAMESPACE", &self.namespace)
            .env("DRAFS_TERMINATION_LOG", self.path("termination-log"))
            .env("DRAFS_LOG", std::env::var("TEST_DRAFS_LOG").unwrap_or("info,drafs=debug,kube_client=off".into()))
            .stdin(Stdio::null());
        cmd
    }

    /// Start in the background with stdout and stderr captured.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    }

    /// Run to completion, killing it after `limit` (a generous safety net).
    pub fn run(&self, args: &[&str], limit: Duration) -> Output {
        wait_output(self.spawn(args), limit)
    }

    /// `drafs init --dir <this environment's dra> EXTRA`, to its end (90 s is a
    /// safety net: every run normally ends by itself long before).
    pub fn init(&self, extra: &[&str]) -> Output {
        let dir = self.path("dra");
        let mut args = vec!["init", "--dir", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        self.run(&args, Duration::from_secs(90))
    }

    pub fn termination_log(&self) -> String {
        std::fs::read_to_string(self.path("termination-log")).unwrap_or_default()
    }
}

/// Wait for a child with a safety limit; a child still running then is killed and
/// the test fails with its output.
pub fn wait_output(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "drafs still running after {limit:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Poll `cond` until it holds, failing after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Poll `cond` until it holds (true) or `limit` passes (false), for a caller
/// that explains the failure itself.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A loopback port free at the time of asking.
/// A port on 127.0.0.1 that is free now, for a server another process will
/// bind. Picked below the kernel's ephemeral range (from 32768 here): a port
/// the kernel hands out (`bind(0)`, and every outgoing connection of the
/// tests running beside) can be taken again before the server binds it, and
/// was (a kube-apiserver failed with "address already in use").
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let (low, span) = (10_000u64, 22_000u64);
    // Each process of a run starts somewhere else in the span.
    let seed = u64::from(std::process::id()).wrapping_mul(7919)
        ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0)
            as u64;
    for _ in 0..span {
        let port = (low + (seed.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) * 997)) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 between {low} and {}", low + span)
}

/// One plain HTTP GET: (status, body), or None if no whole answer came.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: drafs\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}

/// Fails the test with the exit status and stderr unless `out` succeeded.
pub fn assert_ok(out: &Output) {
    assert!(out.status.success(), "exit {:?}\nstderr: {}", out.status.code(), stderr(out));
}

/// The stderr of a run that failed with exit code 1 (a clear error, never a panic).
pub fn assert_failed(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "expected exit 1\nstderr: {}", stderr(out));
    let err = stderr(out);
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// Runs a prepared command to its end (killed after `limit`), capturing its output.
pub fn run_captured(mut cmd: Command, limit: Duration) -> Output {
    wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(), limit)
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every regular file under `dir` (following the top-level symlinks, skipping the
/// hidden `..` payload entries), as relative path -> content.
pub fn read_tree(dir: &Path) -> std::collections::BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dir == root && name.starts_with("..") {
                continue;
            }
            let path = entry.path();
            let meta = std::fs::metadata(&path).unwrap();
            if meta.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Tests that mount FUSE need root and /dev/fuse (CI has both). They fail, never
/// skip, when these are missing, unless DRAFS_NO_FUSE_TESTS=1 outside CI.
pub fn require_fuse() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let dev = Path::new("/dev/fuse").exists();
    if root && dev {
        return true;
    }
    let opted_out = std::env::var("DRAFS_NO_FUSE_TESTS").is_ok_and(|v| v == "1");
    let in_ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
    if opted_out && !in_ci {
        eprintln!("skipped: needs root and /dev/fuse (DRAFS_NO_FUSE_TESTS=1)");
        return false;
    }
    panic!(
        "this test mounts FUSE: it needs root and /dev/fuse (root: {root}, /dev/fuse: {dev}); outside CI, DRAFS_NO_FUSE_TESTS=1 skips it"
    );
}

/// True while `dir` is a mount point listed in /proc/self/mounts.
pub fn is_mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let dir = dir.to_string_lossy();
    mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(&*dir))
}

/// A background `drafs serve`; killed (and its mount detached) if still running on drop.
pub struct Serve {
    pub child: Option<Child>,
    pub dir: PathBuf,
}

impl Serve {
    pub fn start(env: &Env, dir: &Path, extra: &[&str]) -> Serve {
        Serve::start_with_env(env, dir, extra, &[])
    }

    /// [`Serve::start`] with more environment variables.
    pub fn start_with_env(env: &Env, dir: &Path, extra: &[&str], vars: &[(&str, &str)]) -> Serve {
        let mut args = vec!["serve", "--dir", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut cmd = env.command(&args);
        cmd.envs(vars.iter().copied());
        // A process group of its own, so that a test can kill every process of
        // it at once, as the kubelet kills a container's cgroup.
        let child =
            std::os::unix::process::CommandExt::process_group(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()), 0)
                .spawn()
                .unwrap();
        Serve { child: Some(child), dir: dir.to_path_buf() }
    }

    /// [`Serve::start`], then wait until the tree is ready.
    pub fn start_ready(env: &Env, dir: &Path, extra: &[&str], limit: Duration) -> Serve {
        let mut serve = Serve::start(env, dir, extra);
        serve.wait_for(".ready", Some(""), limit);
        serve
    }

    /// A `serve` started by the caller (e.g. against the real control plane).
    pub fn from_child(child: Child, dir: &Path) -> Serve {
        Serve { child: Some(child), dir: dir.to_path_buf() }
    }

    pub fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(rel)).ok()
    }

    /// Wait until `rel` reads `want` (None: until it does not exist).
    pub fn wait_for(&mut self, rel: &str, want: Option<&str>, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let got = self.read(rel);
            if got.as_deref() == want {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                let out = self.child.take().unwrap().wait_with_output().unwrap();
                panic!("drafs serve exited ({status}) while waiting for {rel} = {want:?}\nstderr: {}", stderr(&out));
            }
            if Instant::now() > deadline {
                let out = self.stop_kill();
                panic!(
                    "timed out after {limit:?} waiting for {rel} = {want:?} (got {got:?})\nstderr: {}",
                    stderr(&out)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(pid, sig) };
    }

    /// SIGKILL every process of the serve at once (the supervisor and its
    /// FUSE server), as when a container's cgroup is killed.
    pub fn kill_all(&self) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: the process group Serve::start made for this serve.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }

    /// The process that serves the FUSE tree: the one with /dev/fuse open,
    /// the started process or one of its children.
    pub fn fuse_server_pid(&self) -> Option<i32> {
        fuse_server_of(self.child.as_ref().unwrap().id())
    }

    /// Wait for the process to exit by itself.
    pub fn wait(&mut self, limit: Duration) -> Output {
        wait_output(self.child.take().unwrap(), limit)
    }

    fn stop_kill(&mut self) -> Output {
        let mut child = self.child.take().unwrap();
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        detach(&self.dir);
        out
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop_kill();
        } else {
            detach(&self.dir);
        }
    }
}

/// Lazily unmount whatever is mounted at `dir` (cleanup after a killed server).
pub fn detach(dir: &Path) {
    if let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Run drafs in the repository with `input` on its standard input.
pub fn drafs_with_stdin(args: &[&str], input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(drafs_bin())
        .args(args)
        .current_dir(repo_path(""))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // drafs may exit before reading it all (a usage error is found first):
    // the pipe is then closed, which is no failure of the test's own.
    match child.stdin.take().unwrap().write_all(input.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.unwrap(),
    }
    wait_output(child, Duration::from_secs(60))
}

/// The process that serves the FUSE tree of the `drafs serve` started as
/// `pid`: the one with /dev/fuse open, `pid` itself or one of its children
/// (`serve --backend fuse` forks its server from a supervisor).
pub fn fuse_server_of(pid: u32) -> Option<i32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    std::iter::once(pid.to_string())
        .chain(children.split_whitespace().map(str::to_string))
        .filter_map(|p| p.parse::<i32>().ok())
        .find(|p| holds_dev_fuse(*p))
}

/// Whether process `pid` has /dev/fuse open: the one serving a FUSE tree
/// (drafs's supervisor has not).
pub fn holds_dev_fuse(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == Path::new("/dev/fuse")))
}

/// Whether a real tier is switched off: only outside CI, only when its
/// variable is 1, and then loudly (`what` names the test skipped).
pub fn tier_skipped(variable: &str, what: &str) -> bool {
    let skip = std::env::var_os("CI").is_none() && std::env::var(variable).is_ok_and(|v| v == "1");
    if skip {
        eprintln!("\n*** {variable}=1: SKIPPING {what} (never skipped in CI) ***\n");
    }
    skip
}

/// The `.yaml` files of a directory of the repository, in the order
/// `kubectl apply -f DIR` applies them.
pub fn yaml_files_in(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_path(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// A `/proc/<pid>/status` figure in KiB (`VmRSS:`, `VmHWM:`...); 0 once the process is gone.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A tmpfs of `size` mounted at `dir` by the test, unmounted when dropped.
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    pub fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "drafs-test", dir.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {}", String::from_utf8_lossy(&out.stderr));
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
