//! A process's CPU time and resident memory, read from `/proc/PID/stat`,
//! `/proc/PID/task/*/schedstat` and `/proc/PID/status` (the processes measured by the load)
//! with the `procfs` crate, the workspace's one `/proc` reader.

use procfs::process::Process;

/// The process `pid`, if there is one.
fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

/// Nanoseconds a process's threads ran (the first field of each thread's `schedstat`: exact,
/// where utime+stime have clock-tick resolution). Threads that ended are not counted: the
/// processes measured keep theirs.
pub(crate) fn cpu_ns(pid: u32) -> Option<u64> {
    let tasks = process(pid)?.tasks().ok()?;
    Some(
        tasks
            .flatten()
            .filter_map(|t| t.schedstat().ok())
            .map(|s| s.sum_exec_runtime)
            .sum(),
    )
}

/// The kernel's softirq threads (`ksoftirqd/N`): what the stack defers to them runs on
/// nobody's account but theirs.
pub(crate) fn softirq_threads() -> Vec<u32> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.flatten()
        .filter(|p| p.stat().is_ok_and(|s| s.comm.starts_with("ksoftirqd/")))
        .filter_map(|p| u32::try_from(p.pid()).ok())
        .collect()
}

/// utime + stime of a process in clock ticks (all its threads), from `/proc/PID/stat`.
pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = process(pid)?.stat().ok()?;
    Some(stat.utime + stat.stime)
}

/// Resident memory of a process in KiB, from `VmRSS` in `/proc/PID/status`.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    process(pid)?.status().ok()?.vmrss
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_and_the_softirq_threads_are_read() {
        let me = std::process::id();
        assert!(cpu_ticks(me).is_some());
        assert!(cpu_ns(me).unwrap() > 0);
        assert!(!softirq_threads().is_empty());
        // VmRSS is in KiB: this process holds more than 1 MiB and less than 64 GiB.
        let kib = rss_kib(me).unwrap();
        assert!((1024..64 << 20).contains(&kib), "{kib}");
        assert_eq!(cpu_ticks(u32::MAX), None);
        assert_eq!(rss_kib(u32::MAX), None);
    }
}
