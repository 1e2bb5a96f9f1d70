"""What the benchmark scripts read of a process from /proc: resident memory, open
descriptors, threads. The scripts' one reader (the Rust code's is the procfs crate, behind
lastcall_testkit::procfs for the tests). It stays Python: the scripts sample daemons no Rust
process of ours runs beside, and a program started for every sample would be measured too."""


def _status(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except OSError:
        return ""


def _field(pid, name):
    for line in _status(pid).splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


def rss_kib(pid):
    """VmRSS of `pid` in KiB; 0 once the process is gone."""
    return _field(pid, "VmRSS")


def threads(pid):
    """Threads of `pid`; 0 once the process is gone."""
    return _field(pid, "Threads")


def fds(pid):
    """Open file descriptors of `pid`; 0 once the process is gone."""
    import os

    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def children(pid):
    """The PIDs whose parent is `pid`."""
    import os

    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command may hold spaces and parentheses: the parent PID follows the last ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(d))
    return out
