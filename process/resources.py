"""CPU and memory of every process of a run, sampled from outside with psutil: each process is
found among the runner's descendants and named by its title (``yolo-pipeline infer-0``).
Memory is PSS (proportional set size: a library mapped by several processes is counted once
in the sum), which is what the whole run costs; RSS would count torch once per process."""

from __future__ import annotations

import os
import time

import psutil

from process.lifecycle import TITLE_PREFIX
from wire.messages import is_number

MAX_SAMPLES_PER_PROCESS = 2000  # then every other sample is dropped and sampling slows by half


def process_label(process: psutil.Process, runner_pid: int) -> str:
    """The stage name from the title, or what the helper process is."""
    if process.pid == runner_pid:
        return "runner"
    cmdline = process.cmdline()
    text = " ".join(cmdline)
    if text.startswith(TITLE_PREFIX + " "):
        return text[len(TITLE_PREFIX) + 1:].split()[0]
    if "forkserver" in text:
        return "forkserver"
    if "resource_tracker" in text:
        return "resource-tracker"
    return f"pid-{process.pid}"


def descendants(pid: int) -> list[int] | None:
    """The pids below ``pid`` (children, theirs, ...), from /proc/<pid>/task/<tid>/children: a
    few small reads per process of the run, where psutil's children() reads /proc/<n>/stat of
    every process of the machine. None where the kernel keeps no such lists."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        return None
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:  # it exited meanwhile
            continue
        for tid in tids:
            try:
                kids = [int(k) for k in _read_proc_file(f"/proc/{parent}/task/{tid}/children").split()]
            except (OSError, ValueError):  # that thread ended meanwhile
                continue
            found += kids
            todo += kids
    return found


def _read_proc_file(path: str) -> bytes:
    """A small /proc file in three system calls (Python's open() adds a stat and two seeks)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class StatFiles:
    """/proc/<pid>/stat of each sampled process, kept open and read again at offset 0 (the
    kernel writes it anew on each read): one system call a sample, where opening it took five
    (open, fstat, two seeks, close). A kept file of a process that has exited reads as an
    error (and is closed), never as a later process with the same pid."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}

    def read(self, pid: int) -> tuple[float, int] | None:
        """(CPU seconds, user + system; resident bytes) of ``pid`` (what psutil's cpu_times and
        memory_info read from two files, at several times the cost); None when it is gone or the
        file is not there. Resident bytes read 0 for a process exiting."""
        try:
            fd = self.fds.get(pid)
            if fd is None:
                fd = self.fds[pid] = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
            return parse_stat(os.pread(fd, 4096, 0))
        except OSError:
            self._close(pid)
            return None
        except (ValueError, IndexError):
            return None

    def keep_only(self, pids: set[int]) -> None:
        for pid in [p for p in self.fds if p not in pids]:
            self._close(pid)

    def close(self) -> None:
        self.keep_only(set())

    def _close(self, pid: int) -> None:
        fd = self.fds.pop(pid, None)
        if fd is not None:
            os.close(fd)


def parse_stat(stat: bytes) -> tuple[float, int]:
    """(CPU seconds, resident bytes) from the text of /proc/<pid>/stat."""
    fields = stat[stat.rfind(b")") + 2:].split()  # after the command, which may hold spaces
    # psutil's sum exactly (user / ticks + system / ticks): the report takes any drop of a
    # process's CPU, even a rounding of 1e-16, for a restart and adds the CPU before it again
    return int(fields[11]) / _CLOCK_TICKS + int(fields[12]) / _CLOCK_TICKS, int(fields[21]) * _PAGE_BYTES


def machine_busy_s() -> float:
    """Busy core-seconds of the whole machine since boot: what else runs beside this pipeline
    (other jobs on a shared machine) shows as busy time that none of its processes used."""
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    total = sum(getattr(times, field) for field in times._fields if field not in ("guest", "guest_nice"))
    return total - idle


class ResourceSampler:
    """Samples [t_s, cpu_s, rss_bytes, pss_bytes] per process (t on the perf_counter clock of
    every frame timestamp; cpu cumulative user + system). PSS costs the kernel a walk of the
    process's whole address space (about 6 ms for a process that maps torch: 65 CPU-ms for a
    run's ten processes, measured), so a round of PSS reads comes at most every PSS_EVERY
    samples and no sooner than its own cost allows within PSS_BUDGET of one core; the others
    hold None. CPU and RSS are cheap (one read of a kept /proc/<pid>/stat) and read every
    time; the process list is read again every LIST_EVERY samples, from the kernel's lists of
    each process's children (psutil's scan of every process of the machine where the kernel has
    none). A process's name is read until it has its title, then kept."""

    PSS_EVERY = 4
    PSS_BUDGET = 0.002  # of one core: what the collector spends on PSS reads at most (2 CPU-ms a second)
    LIST_EVERY = 4
    FIRST_PSS_READS = 1  # read on a process's first sample too (a short-lived worker sends its own at exit)

    def __init__(self, runner_pid: int):
        self.runner_pid = runner_pid
        self.series: dict[int, dict] = {}  # by pid: a process is named by its title once it has one
        self.machine_cpu: list[list[float]] = []  # [t_s, busy core-seconds of the whole machine]
        self.ticks = 0
        self.every = 1  # keep one sample in `every`: long runs keep a flat, coarser history
        self.processes: list[psutil.Process] = []
        self.labels: dict[int, str] = {}  # pid -> its stage name, once it has one (a title does not change back)
        self.next_pss_s = 0.0  # perf_counter time before which no round of PSS reads starts
        self.stat_files = StatFiles()

    def sample(self, final: bool = False) -> None:
        self.ticks += 1
        if self.ticks % self.every and not final:
            return
        now = time.perf_counter()
        with_pss = final or ((self.ticks // self.every) % self.PSS_EVERY == 1 and now >= self.next_pss_s)
        self.machine_cpu.append([now, machine_busy_s()])
        if final or not self.processes or self.ticks % self.LIST_EVERY == 1:
            try:
                self.processes = self._list()
            except psutil.Error:
                return
            self.stat_files.keep_only({process.pid for process in self.processes})
        cpu_before = time.process_time()
        self._read(with_pss)
        if with_pss:
            self.next_pss_s = now + (time.process_time() - cpu_before) / self.PSS_BUDGET
        if any(len(e["samples"]) >= MAX_SAMPLES_PER_PROCESS for e in self.series.values()):
            for entry in self.series.values():
                entry["samples"] = entry["samples"][::2]
            self.machine_cpu = self.machine_cpu[::2]
            self.every *= 2

    def close(self) -> None:
        self.stat_files.close()

    def _list(self) -> list[psutil.Process]:
        """The runner and every process below it; a process seen before keeps its object."""
        pids = descendants(self.runner_pid)
        if pids is None:
            runner = psutil.Process(self.runner_pid)
            return [runner] + runner.children(recursive=True)
        known = {process.pid: process for process in self.processes}
        listed = []
        for pid in [self.runner_pid] + pids:
            try:
                listed.append(known.get(pid) or psutil.Process(pid))
            except psutil.Error:  # it exited meanwhile
                if pid == self.runner_pid:
                    raise
        return listed

    def _read(self, with_pss: bool) -> None:
        for process in self.processes:
            known = self.series.get(process.pid)
            read_pss = with_pss or known is None or known["pss_reads"] < self.FIRST_PSS_READS
            if not read_pss and process.pid in self.labels:  # the usual sample: one read of /proc/<pid>/stat
                usage = self.stat_files.read(process.pid)
                if usage is not None:
                    known["samples"].append([time.perf_counter(), usage[0], usage[1] or None, None])
                continue
            try:
                with process.oneshot():
                    label = self.labels.get(process.pid) or process_label(process, self.runner_pid)
                    for_good = self._named_for_good(process, label)
                    cpu = process.cpu_times()
                    memory = process.memory_full_info() if read_pss else process.memory_info()
            except psutil.Error:  # it exited between listing and reading
                continue
            entry = self.series.setdefault(process.pid, {"pid": process.pid, "samples": [], "pss_reads": 0})
            if not label.startswith("pid-") and label != "forkserver" or "label" not in entry:
                entry["label"] = label  # a stage's title replaces what its process was called at birth
            if for_good:
                self.labels[process.pid] = label
            if not memory.rss:  # an exited process not yet reaped: its memory reads 0, which is no sample
                memory = None
            pss = getattr(memory, "pss", None)
            entry["pss_reads"] += pss is not None
            entry["samples"].append([time.perf_counter(), cpu.user + cpu.system, memory and memory.rss, pss])

    def _named_for_good(self, process: psutil.Process, label: str) -> bool:
        """Whether ``label`` will stay this process's name, so that its later samples need only
        /proc/<pid>/stat: a stage's title does; "forkserver" only for the fork server itself (the
        runner's child: a worker reads so until it takes its title)."""
        if label.startswith("pid-"):
            return False
        return label != "forkserver" or process.ppid() == self.runner_pid

    def add_exit_usage(self, name: str, pid: int, usage: dict) -> None:
        """A worker's own last sample (:func:`process.lifecycle.own_usage`), under the name its
        stats carry: the process may have exited before any sample, or been seen only before it
        took its title."""
        sample, peak = usage.get("sample"), usage.get("peak_rss_bytes")
        if not (isinstance(sample, list) and len(sample) == 4 and is_number(sample[0]) and is_number(sample[1])
                and all(v is None or is_number(v) for v in sample[2:])):
            return
        entry = self.series.setdefault(pid, {"pid": pid, "samples": [], "pss_reads": 0})
        entry["label"] = name
        entry["samples"] = sorted(entry["samples"] + [sample], key=lambda s: s[0])
        if is_number(peak):
            entry["peak_rss_bytes"] = max(int(peak), entry.get("peak_rss_bytes") or 0)

    def export(self) -> dict[str, dict]:
        """{name: {"pid", "role", "samples", ["peak_rss_bytes"]}}; a restarted worker's
        incarnations follow one another in one series (its CPU restarts from zero, which the
        analysis unwraps)."""
        by_name: dict[str, dict] = {}
        for entry in sorted(self.series.values(), key=lambda e: e["samples"][0][0] if e["samples"] else 0.0):
            name = entry["label"]
            merged = by_name.setdefault(name, {"pid": entry["pid"], "role": name.split("-")[0], "samples": []})
            merged["pid"] = entry["pid"]
            merged["samples"].extend(entry["samples"])
            if entry.get("peak_rss_bytes"):
                merged["peak_rss_bytes"] = max(entry["peak_rss_bytes"], merged.get("peak_rss_bytes") or 0)
        return by_name
