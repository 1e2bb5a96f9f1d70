//! A process's CPU time and resident memory, read from `/proc/PID/stat` and
//! `/proc/PID/status` (the server measured by the load).

use std::fs;

/// utime + stime of a process in clock ticks (all its threads), from `/proc/PID/stat`.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
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
pub fn rss_kib(pid: u32) -> Option<u64> {
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
        assert!(rss_kib(me).unwrap() > 0);
    }
}
