//! A process's CPU time and resident memory, read from `/proc/PID/stat`,
//! `/proc/PID/task/*/schedstat` and `/proc/PID/status` (the processes measured by the load).

use std::fs;

/// Nanoseconds a process's threads ran (the first field of each thread's `schedstat`: exact,
/// where utime+stime have clock-tick resolution). Threads that ended are not counted: the
/// processes measured keep theirs.
pub(crate) fn cpu_ns(pid: u32) -> Option<u64> {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut sum = 0u64;
    for t in tasks.flatten() {
        let Ok(s) = fs::read_to_string(t.path().join("schedstat")) else {
            continue;
        };
        sum += s
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(sum)
}

/// The kernel's softirq threads (`ksoftirqd/N`): what the stack defers to them runs on
/// nobody's account but theirs.
pub(crate) fn softirq_threads() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("ksoftirqd/"))
        })
        .collect()
}

/// utime + stime of a process in clock ticks (all its threads), from `/proc/PID/stat`.
pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    parse_stat_ticks(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses: start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut f = rest.split_whitespace();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Resident memory of a process in KiB, from `VmRSS` in `/proc/PID/status`.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    parse_vmrss(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

fn parse_vmrss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_parsers() {
        let stat = "1234 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 37 0 0 20 0 4 0 100";
        assert_eq!(parse_stat_ticks(stat), Some(287));
        assert_eq!(parse_stat_ticks("garbage"), None);
        let status = "Name:\tx\nVmPeak:\t 100 kB\nVmRSS:\t    5120 kB\n";
        assert_eq!(parse_vmrss(status), Some(5120));
        let me = std::process::id();
        assert!(cpu_ticks(me).is_some());
        assert!(cpu_ns(me).unwrap() > 0);
        assert!(!softirq_threads().is_empty());
        assert!(rss_kib(me).unwrap() > 0);
    }
}
