//! What a test measures of a process from `/proc`: resident memory (`VmRSS`), its peak
//! while something runs, open descriptors, CPU time, whether it still runs. One reader for
//! every test, so that they all count the same thing, on the `procfs` crate the agent's
//! `process_*` metrics use (bench/procfs.py is the scripts' one).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use procfs::process::{LimitValue, ProcState, Process, Status};

/// The process `pid`, if there is one.
fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

/// Resident memory of `pid` in bytes (`VmRSS` of `/proc/PID/status`); 0 once the process
/// is gone.
pub fn rss(pid: u32) -> u64 {
    process(pid)
        .and_then(|p| p.status().ok())
        .and_then(|s| s.vmrss)
        .map_or(0, |kib| kib * 1024)
}

/// Resident memory of this process in bytes.
pub fn rss_self() -> u64 {
    rss(std::process::id())
}

/// Open file descriptors of `pid` (entries of `/proc/PID/fd`); 0 once the process is gone.
pub fn fds(pid: u32) -> usize {
    process(pid).and_then(|p| p.fd_count().ok()).unwrap_or(0)
}

/// CPU time `pid` has used so far, user and system, all its threads (`/proc/PID/stat`
/// utime + stime); zero once the process is gone.
pub fn cpu_time(pid: u32) -> Duration {
    let ticks = process(pid)
        .and_then(|p| p.stat().ok())
        .map_or(0, |s| s.utime + s.stime);
    Duration::from_secs_f64(ticks as f64 / procfs::ticks_per_second().max(1) as f64)
}

/// Whether `pid` is a live process (not a zombie, not dead).
pub fn alive(pid: u32) -> bool {
    process(pid)
        .and_then(|p| p.stat().ok())
        .and_then(|s| s.state().ok())
        .is_some_and(|state| !matches!(state, ProcState::Zombie | ProcState::Dead))
}

/// The command name of `pid` (`/proc/PID/comm`), if it runs.
pub fn comm(pid: u32) -> Option<String> {
    Some(process(pid)?.stat().ok()?.comm)
}

/// `/proc/PID/status` of `pid` (identity, capabilities, memory), if it runs.
pub fn status(pid: u32) -> Option<Status> {
    process(pid)?.status().ok()
}

/// `/proc/PID/task/TID/status` of each thread of `pid`.
pub fn thread_statuses(pid: u32) -> Vec<Status> {
    let Some(tasks) = process(pid).and_then(|p| p.tasks().ok()) else {
        return Vec::new();
    };
    tasks.flatten().filter_map(|t| t.status().ok()).collect()
}

/// This process's effective uid.
pub fn euid() -> u32 {
    status(std::process::id()).map_or(u32::MAX, |s| s.euid)
}

/// This process's limit on open files, soft and hard (`Max open files` of
/// `/proc/self/limits`; unlimited as `u64::MAX`); 1024 each when it cannot be read.
pub fn open_files_limit() -> (u64, u64) {
    let value = |v: LimitValue| match v {
        LimitValue::Unlimited => u64::MAX,
        LimitValue::Value(n) => n,
    };
    process(std::process::id())
        .and_then(|p| p.limits().ok())
        .map_or((1024, 1024), |l| {
            let files = l.max_open_files;
            (value(files.soft_limit), value(files.hard_limit))
        })
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
    fn this_process_has_memory_descriptors_and_cpu_time() {
        let me = std::process::id();
        assert!(rss_self() > 1 << 20, "{}", rss_self());
        assert!(fds(me) >= 3);
        assert!(alive(me));
        let before = rss_self();
        let peak = PeakRss::start(me);
        let held = std::hint::black_box(vec![1u8; 32 << 20]);
        std::thread::sleep(Duration::from_millis(60));
        let seen = peak.finish();
        assert!(seen >= before + (24 << 20), "before {before}, peak {seen}");
        drop(held);
        let spent = cpu_time(me);
        crate::wait_until(
            "this process's CPU time grows",
            Duration::from_secs(20),
            || {
                (0..1_000_000u64).fold(0u64, |a, i| std::hint::black_box(a ^ i));
                (cpu_time(me) > spent).then_some(())
            },
        );
        let (soft, hard) = open_files_limit();
        assert!(soft <= hard && soft as usize >= fds(me), "{soft} {hard}");
        // /proc/self belongs to the effective uid.
        let own = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
        assert_eq!(euid(), own);
        assert_eq!(
            thread_statuses(me).len(),
            status(me).unwrap().threads as usize
        );
        assert_eq!(rss(u32::MAX), 0);
        assert_eq!(fds(u32::MAX), 0);
        assert_eq!(cpu_time(u32::MAX), Duration::ZERO);
        assert!(!alive(u32::MAX));
    }

    /// A child that has exited and not been waited for is a zombie: not alive.
    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        crate::wait_until("the child exits", Duration::from_secs(20), || {
            (!alive(pid)).then_some(())
        });
        assert!(process(pid).is_some(), "the zombie is still in /proc");
        assert_eq!(comm(pid).as_deref(), Some("true"));
        child.wait().expect("wait");
    }
}
