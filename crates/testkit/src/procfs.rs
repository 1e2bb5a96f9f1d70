//! What a test measures of a process from `/proc`: resident memory (`VmRSS`), its peak
//! while something runs, and open descriptors. One reader for every test, so that they all
//! count the same thing (bench/procfs.py is the scripts' one).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Resident memory of `pid` in bytes (`VmRSS` of `/proc/PID/status`); 0 once the process
/// is gone.
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    vm_rss_bytes(&status).unwrap_or(0)
}

/// Resident memory of this process in bytes.
pub fn rss_self() -> u64 {
    rss(std::process::id())
}

/// `VmRSS` of a `/proc/PID/status` text, in bytes.
fn vm_rss_bytes(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// Open file descriptors of `pid` (entries of `/proc/PID/fd`); 0 once the process is gone.
pub fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Bytes as MiB, for messages.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The largest RSS of a process, sampled every 20 ms on a thread until [`PeakRss::finish`].
#[derive(Debug)]
pub struct PeakRss {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl PeakRss {
    /// Starts sampling `pid`.
    pub fn start(pid: u32) -> PeakRss {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !s.load(Ordering::SeqCst) {
                peak = peak.max(rss(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak.max(rss(pid))
        });
        PeakRss {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops sampling; the largest RSS seen, in bytes.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

impl Drop for PeakRss {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_bytes() {
        let status = "Name:\tx\nVmHWM:\t  9000 kB\nVmRSS:\t   51234 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(vm_rss_bytes(status), Some(51_234 * 1024));
        assert_eq!(vm_rss_bytes("Name:\tx\n"), None);
    }

    #[test]
    fn this_process_has_memory_and_descriptors() {
        let me = std::process::id();
        assert!(rss_self() > 1 << 20, "{}", rss_self());
        assert!(fds(me) >= 3);
        let before = rss_self();
        let peak = PeakRss::start(me);
        let held = std::hint::black_box(vec![1u8; 32 << 20]);
        std::thread::sleep(Duration::from_millis(60));
        let seen = peak.finish();
        assert!(seen >= before + (24 << 20), "before {before}, peak {seen}");
        drop(held);
        assert_eq!(rss(u32::MAX), 0);
        assert_eq!(fds(u32::MAX), 0);
    }
}
