//! The process's own figures under the names every Prometheus client library
//! gives them (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! ...), so that the dashboards and alerts a platform team already has for
//! its other agents read drafs's endpoints too. Read from Linux's
//! `/proc/self` at each scrape; a figure that cannot be read is left out.

use std::path::Path;

use nix::unistd::{SysconfVar, sysconf};

use super::prometheus::{Kind, Text};

/// One reading of the process's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub cpu_seconds: f64,
    pub virtual_bytes: u64,
    pub resident_bytes: u64,
    /// Unix seconds.
    pub start_time_seconds: f64,
}

/// The figures in `/proc/self/stat` (`stat`), given the clock's ticks per
/// second, the page size and the boot time (Unix seconds) they are counted in.
pub fn parse_stat(stat: &str, ticks_per_second: u64, page_bytes: u64, boot_time: u64) -> Option<Stats> {
    // The command (field 2) is in parentheses and may hold spaces and ')':
    // the fields that follow start after the last ')', with field 3.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let ticks = ticks_per_second.max(1) as f64;
    Some(Stats {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        start_time_seconds: boot_time as f64 + field(22)? as f64 / ticks,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)?.saturating_mul(page_bytes),
    })
}

/// The boot time in `/proc/stat` (its `btime` line).
pub fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

/// The soft limit of open files in `/proc/self/limits` ("unlimited": none).
pub fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files").split_whitespace().next()?.parse().ok()
}

/// The `process_*` families for this process, as far as `/proc` tells them.
pub fn exposition() -> String {
    let mut out = Text::default();
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let conf = |var| sysconf(var).ok().flatten().and_then(|v| u64::try_from(v).ok());
    let stats = (|| {
        let boot = parse_boot_time(&read("/proc/stat")?)?;
        parse_stat(&read("/proc/self/stat")?, conf(SysconfVar::CLK_TCK)?, conf(SysconfVar::PAGE_SIZE)?, boot)
    })();
    if let Some(s) = stats {
        out.single(
            "process_cpu_seconds_total",
            Kind::Counter,
            "User and system CPU time spent, in seconds.",
            s.cpu_seconds,
        );
        out.single("process_resident_memory_bytes", Kind::Gauge, "Resident memory size in bytes.", s.resident_bytes);
        out.single("process_virtual_memory_bytes", Kind::Gauge, "Virtual memory size in bytes.", s.virtual_bytes);
        out.single(
            "process_start_time_seconds",
            Kind::Gauge,
            "Start time of the process since the Unix epoch, in seconds.",
            s.start_time_seconds,
        );
    }
    if let Ok(fds) = std::fs::read_dir(Path::new("/proc/self/fd")) {
        // The directory's own descriptor, open while it is read, is not counted.
        let open = fds.count().saturating_sub(1);
        out.single("process_open_fds", Kind::Gauge, "Number of open file descriptors.", open);
    }
    if let Some(max) = read("/proc/self/limits").as_deref().and_then(parse_max_fds) {
        out.single("process_max_fds", Kind::Gauge, "Maximum number of open file descriptors.", max);
    }
    out.into_text()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_with_spaces_and_parentheses() {
        // Fields 3.. of a real line, the command changed to one that misleads
        // a split on spaces or on the first ')'.
        let stat = "4242 (dr) afs x) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 50 0 0 20 0 8 0 \
                    1000 123456789 3000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let stats = parse_stat(stat, 100, 4096, 1_700_000_000).unwrap();
        assert_eq!(
            stats,
            Stats {
                cpu_seconds: 3.0,
                virtual_bytes: 123_456_789,
                resident_bytes: 3000 * 4096,
                start_time_seconds: 1_700_000_010.0,
            }
        );
        assert_eq!(parse_stat("4242 (drafs) S 1 2", 100, 4096, 0), None, "cut short");
        assert_eq!(parse_stat("no parenthesis", 100, 4096, 0), None);
    }

    #[test]
    fn boot_time_and_the_open_files_limit() {
        assert_eq!(parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"), Some(1_700_000_000));
        assert_eq!(parse_boot_time("cpu 1\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1048576              1048576              files     \n";
        assert_eq!(parse_max_fds(limits), Some(1_048_576));
        assert_eq!(parse_max_fds("Max open files            unlimited            unlimited            files\n"), None);
    }

    #[test]
    fn this_process_reads_as_running_with_memory_and_open_files() {
        let text = exposition();
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{name} in {text}"))
        };
        // qemu-user (CI's arm64 run) fills only some fields of /proc/self/stat, memory as 0.
        if value("process_virtual_memory_bytes") > 0.0 {
            assert!(value("process_resident_memory_bytes") > 0.0, "{text}");
        }
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_open_fds") >= 1.0, "{text}");
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(started <= now + 1.0 && started > now - 86_400.0 * 365.0, "{started} against {now}");
        assert!(value("process_cpu_seconds_total") >= 0.0);
    }
}
