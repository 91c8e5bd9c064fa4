"""analysis.resources by hand: CPU interpolated at the window's ends, restarts unwrapped,
peak and mean memory, and the peak of the summed PSS; the sampler on a process that exited."""

import os
import subprocess
import sys
import time
import psutil
import pytest

from analysis.report import build_report
from analysis.resources import cpu_between, cumulative_cpu, peak_pss_total, process_usage, resource_report
from tests.analysis_runs import MIB, steady_run
from tests.live_run import REPO
from process import resources
from process.resources import ResourceSampler

MB = 1_000_000


def test_cpu_between_interpolates_at_both_ends():
    samples = [[0.0, 1.0, 10, 6], [1.0, 1.5, 10, 6], [2.0, 3.5, 10, 6]]
    # at 0.5 s: 1.25; at 1.5 s: 2.5
    assert cpu_between(samples, 0.5, 1.5) == pytest.approx(1.25)
    # before the first sample: the first value; after the last: the last (it used no more)
    assert cpu_between(samples, -5.0, 9.0) == pytest.approx(2.5)
    assert cpu_between(samples, 1.5, 1.5) == 0.0 and cpu_between([], 0.0, 1.0) == 0.0


def test_a_restart_under_one_name_is_unwrapped():
    # the first process reaches 3.0 s of CPU, dies; the new one is at 0.5 s, then 1.5 s
    samples = [[0.0, 1.0, 1, 1], [1.0, 3.0, 1, 1], [2.0, 0.5, 1, 1], [3.0, 1.5, 1, 1]]
    t, cpu = cumulative_cpu(samples)
    assert list(cpu) == [1.0, 3.0, 3.5, 4.5]
    assert cpu_between(samples, 0.0, 3.0) == pytest.approx(3.5)


def test_process_usage_by_hand():
    entry = {"pid": 7, "role": "post",
             "samples": [[0.0, 0.0, 100 * MB, 60 * MB], [1.0, 0.5, 300 * MB, None], [2.0, 1.0, 200 * MB, 90 * MB]]}
    got = process_usage(entry, 0.5, 1.5)
    assert (got["peak_rss_bytes"], got["mean_rss_bytes"]) == (300 * MB, pytest.approx(200 * MB))
    assert (got["peak_pss_bytes"], got["mean_pss_bytes"]) == (90 * MB, pytest.approx(75 * MB))  # None skipped
    assert got["cpu_percent_mean"] == pytest.approx(50.0) and got["window_cpu_s"] == pytest.approx(0.5)


def test_peak_pss_total_sums_processes_at_each_time():
    resources = {"a": {"samples": [[0.0, 0, 0, 10], [2.0, 0, 0, 30]]},
                 "b": {"samples": [[1.0, 0, 0, 100], [3.0, 0, 0, 50]]},
                 "c": {"samples": [[0.0, 0, 0, None]]}}
    # times 0, 1, 2, 3: a is 10, 20, 30, 0 (gone); b is 0 (not yet), 100, 75, 50
    assert peak_pss_total(resources) == 120
    assert peak_pss_total({"c": resources["c"]}) is None


def test_resource_report_saturation():
    resources = {"a": {"pid": 1, "role": "infer", "samples": [[0.0, 0.0, 1, 1], [10.0, 9.0, 1, 1]]},
                 "b": {"pid": 2, "role": "pre", "samples": [[0.0, 0.0, 1, 1], [10.0, 7.0, 1, 1]]}}
    got = resource_report(resources, 2.0, 7.0, cores=2)
    # in 5 s: 4.5 + 3.5 = 8 CPU-s of 10 available
    assert got["window_cpu_s"] == pytest.approx(8.0) and got["saturation"] == pytest.approx(0.8)
    assert resource_report({}, 2.0, 7.0, cores=2)["saturation"] is None


def test_report_carries_cpu_per_frame_and_memory():
    report = build_report(steady_run(frames=120, period_s=0.05, wall_ms={"pre": 10, "infer": 30, "post": 10},
                                     other_cpu_ms=2.0))
    # every process's CPU over the window per frame completed in it: 10 + 30 + 10 + 2
    assert report["cpu"]["cpu_ms_per_frame"] == pytest.approx(52.0)
    assert report["cpu"]["by_role"] == pytest.approx({"pre": 10.0, "infer": 30.0, "post": 10.0, "other": 2.0})
    # 52 ms per frame at 20 fps on 2 cores
    assert report["cpu"]["saturation"] == pytest.approx(52 * 20 / 2000)
    processes = report["resources"]["processes"]
    assert set(processes) == {"pre-0", "pre-1", "infer-0", "infer-1", "post-0", "post-1", "collector", "runner"}
    assert processes["infer-0"]["peak_rss_bytes"] == 401 * MIB
    assert processes["infer-0"]["peak_pss_bytes"] == int(400 * MIB * 0.6)
    # PSS is constant: the total is the sum of every process's
    assert report["resources"]["peak_pss_total_bytes"] == sum(p["peak_pss_bytes"] for p in processes.values())
    assert report["summary"]["peak_pss_total_bytes"] == report["resources"]["peak_pss_total_bytes"]
    assert report["stages"]["infer"]["per_worker"][0]["peak_pss_bytes"] == int(400 * MIB * 0.6)


def test_other_jobs_load_leaves_fewer_cores_to_the_run():
    from analysis.resources import resource_report
    # one process using 0.5 core for 10 s, while the whole machine (2 cores) was busy 1.5 cores
    resources = {"infer-0": {"pid": 1, "role": "infer", "samples": [[0.0, 0.0, 1, 1], [10.0, 5.0, 1, 1]]}}
    machine = [[0.0, 100.0], [10.0, 115.0]]
    usage = resource_report(resources, 0.0, 10.0, 2, machine)
    assert usage["other_load_cores"] == pytest.approx(1.0)
    assert usage["cores"] == pytest.approx(1.0) and usage["saturation"] == pytest.approx(0.5)
    alone = resource_report(resources, 0.0, 10.0, 2)
    assert alone["cores"] == 2 and alone["other_load_cores"] is None and alone["saturation"] == pytest.approx(0.25)


def test_a_process_whose_memory_reads_zero_gives_no_memory_sample(monkeypatch):
    """A process in the middle of exiting has given back its memory, and /proc reads 0 for it
    while its title can still be read: recorded as unknown, never as a 0 MiB peak."""
    child = subprocess.Popen([sys.executable, "-c", "import setproctitle, time\n"  # titled: its usual sample
                              "setproctitle.setproctitle('yolo-pipeline pre-9')\nprint('titled', flush=True)\n"
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True)  # reads /proc/<pid>/stat only
    assert child.stdout.readline() == "titled\n"
    real_info, real_full = psutil.Process.memory_info, psutil.Process.memory_full_info

    def exiting(real):
        def read(self):
            got = real(self)
            return got._replace(rss=0, pss=0) if self.pid == child.pid and hasattr(got, "pss") else \
                got._replace(rss=0) if self.pid == child.pid else got
        read.__dict__.update(real.__dict__)  # psutil's oneshot() caches through attributes of the method
        return read

    monkeypatch.setattr(psutil.Process, "memory_info", exiting(real_info))
    monkeypatch.setattr(psutil.Process, "memory_full_info", exiting(real_full))
    real_read = resources.StatFiles.read
    monkeypatch.setattr(resources.StatFiles, "read",  # the usual sample's one read of /proc/<pid>/stat
                        lambda self, pid: (real_read(self, pid)[0], 0) if pid == child.pid else real_read(self, pid))
    try:
        sampler = ResourceSampler(runner_pid=os.getpid())
        sampler.sample(final=True)
        sampler.sample()
        assert sampler.labels[child.pid] == "pre-9", "the second sample was the usual one"
        samples = sampler.series[child.pid]["samples"]
        assert len(samples) == 2 and all(s[2] is None and s[3] is None for s in samples), samples
        assert samples[0][1] is not None, "its CPU time is still a sample"
        mine = sampler.series[os.getpid()]["samples"][0]
        assert mine[2] > 0 and mine[3] > 0, "a live process keeps its RSS and PSS"
        assert process_usage(sampler.series[child.pid], 0.0, 1.0)["peak_pss_bytes"] is None
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_new_process_gets_its_pss_read_on_its_first_samples():
    """PSS is read on one sample in PSS_EVERY, and on the first FIRST_PSS_READS samples of each
    process, so a worker that lives shorter than PSS_EVERY samples still has a PSS."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sampler = ResourceSampler(runner_pid=os.getpid())
        for _ in range(ResourceSampler.PSS_EVERY):
            sampler.sample()
        pss = [s[3] for s in sampler.series[child.pid]["samples"]]
        reads = ResourceSampler.FIRST_PSS_READS
        assert len(pss) == ResourceSampler.PSS_EVERY and all(p and p > 0 for p in pss[:reads]), pss
        assert all(p is None for p in pss[reads:]), "then only one sample in PSS_EVERY pays for the walk"
    finally:
        child.kill()
        child.wait()


def test_a_worker_that_exited_before_any_sample_is_reported_under_its_name():
    """A worker's own exit sample puts it in the report even if the sampler never saw it, renames
    one the sampler saw only before it took its title, and its high-water mark is the peak."""
    sampler = ResourceSampler(runner_pid=os.getpid())
    sampler.series[111] = {"pid": 111, "label": "pid-111", "samples": [[1.0, 0.1, 50 * MB, None]], "pss_reads": 0}
    sampler.add_exit_usage("pre-0", 111, {"sample": [2.0, 0.4, 60 * MB, 40 * MB], "peak_rss_bytes": 90 * MB})
    sampler.add_exit_usage("post-0", 222, {"sample": [3.0, 0.2, 70 * MB, 30 * MB], "peak_rss_bytes": 80 * MB})
    sampler.add_exit_usage("infer-0", 333, {"sample": ["x", 0.2, 1, 1], "peak_rss_bytes": 1})  # malformed: ignored
    exported = sampler.export()
    assert set(exported) == {"pre-0", "post-0"}
    assert [s[0] for s in exported["pre-0"]["samples"]] == [1.0, 2.0]
    pre = process_usage(exported["pre-0"], 0.0, 5.0)
    assert pre["peak_rss_bytes"] == 90 * MB and pre["peak_pss_bytes"] == 40 * MB, pre
    assert pre["window_cpu_s"] == pytest.approx(0.3)
    assert process_usage(exported["post-0"], 0.0, 5.0)["peak_rss_bytes"] == 80 * MB


def test_own_usage_reports_the_peak_of_memory_already_freed():
    """The high-water mark keeps a peak that fell between samples (a decoded image freed)."""
    code = ("import numpy as np\n"
            "from process.clock import own_usage\n"
            "before = own_usage()\n"
            "block = np.ones(300 << 20, np.uint8); del block\n"
            "after = own_usage()\n"
            "print(before['peak_rss_bytes'], after['peak_rss_bytes'], after['sample'][2], after['sample'][3])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    before, after, rss, pss = map(int, out.split())
    assert after - before > 250 * MIB, (before, after)
    assert rss < after - 250 * MIB and 0 < pss <= rss, (rss, pss, after)


def test_a_stat_read_gives_what_psutil_reads():
    """The usual sample's one read of /proc/<pid>/stat gives the CPU and RSS psutil gives."""
    me, files = psutil.Process(), resources.StatFiles()
    cpu_s, rss = files.read(os.getpid())
    times, memory = me.cpu_times(), me.memory_info()
    assert abs(cpu_s - (times.user + times.system)) < 0.05
    assert abs(rss - memory.rss) < 16 * MIB
    assert files.read(2**22 + 1) is None, "no such process"
    files.close()


def test_proc_stat_sums_cpu_as_psutil_does_to_the_last_bit():
    """A sample read by psutil and the next from /proc/<pid>/stat must not differ by a rounding: the
    report takes any drop of a process's CPU for a restart. 1 + 5 ticks: (1 + 5) / 100 is 0.06,
    1 / 100 + 5 / 100 (psutil's user + system) is 0.060000000000000005."""
    ticks = resources._CLOCK_TICKS
    for utime, stime in ((1, 5), (29, 24), (159, 25), (0, 0), (123456, 7890)):
        stat = (f"42 (yolo-pipeline post-0) S 1 42 42 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 4 0 "
                f"1000 123456789 2500 18446744073709551615").encode()
        cpu_s, rss = resources.parse_stat(stat)
        assert cpu_s == utime / ticks + stime / ticks and rss == 2500 * resources._PAGE_BYTES


def test_a_sample_after_the_first_reads_cpu_and_rss_of_a_titled_process():
    """Once a process is named, its samples come from /proc/<pid>/stat: CPU grows, RSS is there."""
    sampler = ResourceSampler(runner_pid=os.getpid())
    sampler.sample()
    sampler.sample()
    samples = sampler.series[os.getpid()]["samples"]
    assert sampler.labels[os.getpid()] == "runner" and len(samples) == 2
    assert samples[1][1] >= samples[0][1] and samples[1][2] > 0 and samples[1][3] is None


def test_the_fork_server_keeps_its_name_and_a_child_not_yet_titled_does_not():
    """The fork server (the runner's child) is named once, its later samples one read of
    /proc/<pid>/stat; a process it forked reads "forkserver" too until it takes its title, so
    its name is read again on each sample."""
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # forkserver']); time.sleep(60)"
            "  # forkserver")
    server = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(server.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        forked = psutil.Process(server.pid).children()[0].pid
        sampler = ResourceSampler(runner_pid=os.getpid())
        sampler.sample()
        assert sampler.labels.get(server.pid) == "forkserver"
        assert forked not in sampler.labels and sampler.series[forked]["label"] == "forkserver"
        sampler.sample()
        assert sampler.series[server.pid]["samples"][1][3] is None and len(sampler.series[forked]["samples"]) == 2
    finally:
        for process in psutil.Process(server.pid).children() + [psutil.Process(server.pid)]:
            process.kill()
        server.wait()


def test_a_kept_stat_file_reads_what_a_fresh_one_reads_and_an_exited_process_reads_none():
    """StatFiles reads /proc/<pid>/stat again through one open file: the CPU it reads grows as
    the process runs, and once the process has exited (and is reaped) it reads None, not the
    figures of whatever takes its pid later; the file is closed then."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
                              "while time.process_time() < end: pass\nprint('idle', flush=True)\ntime.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    files = resources.StatFiles()
    try:
        first = files.read(child.pid)
        assert child.stdout.readline() == "idle\n"  # its CPU clock stands still from here
        fresh_files = resources.StatFiles()
        second, fresh = files.read(child.pid), fresh_files.read(child.pid)
        fresh_files.close()
        assert first is not None and second is not None and second[0] >= first[0] and second[1] > 0
        assert second[0] == fresh[0] and abs(second[1] - fresh[1]) < 16 * MIB
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert files.read(child.pid) is None and child.pid not in files.fds
    files.close()


def test_a_process_that_exits_while_its_name_is_judged_is_left_out_of_that_sample(monkeypatch):
    """Whether "forkserver" is the fork server itself is read from the process (its parent): a
    forked child that exits and is reaped just then is skipped, not a crash of the collector."""
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # forkserver"])

    def gone(self):
        raise psutil.NoSuchProcess(self.pid)

    gone.__dict__.update(psutil.Process.ppid.__dict__)  # psutil's oneshot() caches through attributes of the method
    monkeypatch.setattr(psutil.Process, "ppid", gone)
    try:
        sampler = ResourceSampler(runner_pid=os.getpid())
        sampler.sample()
        assert server.pid not in sampler.series and server.pid not in sampler.labels
        assert sampler.series[os.getpid()]["samples"], "the others are sampled as usual"
    finally:
        server.kill()
        server.wait()
