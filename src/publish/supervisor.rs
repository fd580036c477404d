//! The FUSE server's supervisor.
//!
//! A FUSE mount outlives the process that serves it: killed by SIGKILL, a
//! crash or the OOM killer, the server leaves a stale mount (every access
//! fails with ENOTCONN), and while it is there the kubelet cannot tear the
//! pod's volume down, so the pod hangs in Terminating. `serve --backend fuse`
//! therefore runs as two processes: the server, forked before anything else
//! starts, and this supervisor, which only waits. It forwards the stop
//! signals to the server, and when the server is gone it unmounts a stale
//! drafs tree the server left, then exits with the server's status (128 + the
//! signal's number when killed, as a shell reports it). The server stops
//! (SIGTERM) if the supervisor dies first. The supervisor survives an OOM
//! kill of the whole container where it may (see `protect_from_oom_killer`).
//! When both die at once anyway (the container's cgroup is killed), the next
//! instance clears the stale mount before it mounts (`fuse::FuseMount::mount`).

use std::io;
use std::path::Path;

use tracing::{debug, warn};

use crate::publish::fuse;

/// Signals the supervisor passes on to the server (its stop signals, `cmd::Stop`).
const FORWARDED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Which process the caller now is.
#[derive(Debug, PartialEq, Eq)]
pub enum Role {
    /// The server: go on and serve.
    Server,
    /// The supervisor, after the server ended: exit with this code.
    Done(i32),
}

/// Fork the server. Must be called while the process has one thread (before
/// the async runtime starts): only the calling thread survives a fork.
pub fn fork_server(dir: &Path) -> io::Result<Role> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    let mut wanted: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut previous: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: the sets are valid for the calls; the process has one thread,
    // so fork copies a consistent state and the child may run Rust code.
    unsafe {
        libc::sigemptyset(&mut wanted);
        for signal in FORWARDED.iter().chain(&[libc::SIGCHLD]) {
            libc::sigaddset(&mut wanted, *signal);
        }
        // Blocked before the fork, so that none is lost before sigwait.
        if libc::pthread_sigmask(libc::SIG_BLOCK, &wanted, &mut previous) != 0 {
            return Err(io::Error::last_os_error());
        }
        let supervisor = libc::getpid();
        match libc::fork() {
            -1 => {
                let err = io::Error::last_os_error();
                libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
                Err(err)
            }
            0 => {
                // The server: stopped gracefully if the supervisor goes away
                // (and at once if it already has).
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
                if libc::getppid() != supervisor {
                    libc::_exit(1);
                }
                Ok(Role::Server)
            }
            server => {
                protect_from_oom_killer();
                Ok(Role::Done(supervise(server, dir, &wanted)))
            }
        }
    }
}

/// Keep the supervisor alive when the kernel kills the container's processes
/// for memory: with `memory.oom.group` (the kubelet's default on cgroup v2)
/// an OOM kill takes every process of the container except those at -1000.
/// The supervisor uses almost no memory. Lowering the score needs
/// CAP_SYS_RESOURCE, which the privileged FUSE sidecar has; without it the
/// supervisor still covers a kill of the server alone.
fn protect_from_oom_killer() {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        debug!("cannot protect the supervisor from the OOM killer: {e}");
    }
}

/// Wait for the server, passing signals on; clean up after it.
fn supervise(server: libc::pid_t, dir: &Path, wanted: &libc::sigset_t) -> i32 {
    loop {
        let mut signal: libc::c_int = 0;
        // SAFETY: both pointers are valid for the call.
        if unsafe { libc::sigwait(wanted, &mut signal) } != 0 {
            continue;
        }
        if signal != libc::SIGCHLD {
            // SAFETY: a plain kill(2) of our own child.
            unsafe { libc::kill(server, signal) };
            continue;
        }
        // Reap every child (as PID 1 of a container, orphans are ours too).
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: status is valid for the call.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if pid == server {
                return finish(status, dir);
            }
        }
    }
}

/// The server's exit code, after unmounting a stale tree it left.
fn finish(status: libc::c_int, dir: &Path) -> i32 {
    let (code, how) = if libc::WIFEXITED(status) {
        (libc::WEXITSTATUS(status), format!("exited with {}", libc::WEXITSTATUS(status)))
    } else if libc::WIFSIGNALED(status) {
        (128 + libc::WTERMSIG(status), format!("was killed by signal {}", libc::WTERMSIG(status)))
    } else {
        (1, format!("ended with status {status}"))
    };
    if becomes_stale(dir, STALE_WITHIN) && fuse::top_mount(dir).is_some_and(|m| m.is_drafs()) {
        warn!(dir = %dir.display(), "the FUSE server {how}; unmounting the tree it left");
        fuse::unmount(dir);
    }
    code
}

/// How long a dead server's mount may take to turn stale.
const STALE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the drafs mount at `dir` is, or within `limit` turns, stale. A dead
/// server's mount turns stale when the kernel has released its last
/// `/dev/fuse` descriptor, which can trail the exit the supervisor is told of
/// (its threads still leaving a read of the device); checked once, it was
/// sometimes still live and was left mounted. No drafs mount there (the
/// server unmounted its tree): false at once.
fn becomes_stale(dir: &Path, limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if fuse::is_stale_mount(dir) {
            return true;
        }
        if !fuse::top_mount(dir).is_some_and(|m| m.is_drafs()) || std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
