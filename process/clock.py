"""How a stage accounts its time (busy with frames, waiting for input, blocked on output, in wall
and CPU clocks) and the summary of it every process sends the collector as it ends."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from dataclasses import dataclass, field

import psutil
import zmq

from analysis.samples import Samples
from wire.messages import Stats
from wire.transport import DropCounter
from wire.wiring import StageArgs


@dataclass
class Clock:
    """Splits a worker's wall time into busy, waiting for input and blocked on output, and
    keeps the CPU time of its busy sections: the process's, every thread of it (torch's intra-op
    threads work on the frame too; time-slicing on shared cores inflates wall time, never CPU)."""

    started_s: float = field(default_factory=time.perf_counter)
    started_cpu_s: float = field(default_factory=time.process_time)  # all threads of the process
    busy_s: float = 0.0
    busy_cpu_s: float = 0.0
    wait_in_s: float = 0.0
    blocked_out_s: float = 0.0
    frame_ms: Samples = field(default_factory=Samples)
    frame_cpu_ms: Samples = field(default_factory=Samples)

    @contextlib.contextmanager
    def busy(self):
        """Time a section of frame work; yields a list that receives (wall_s, cpu_s) at the end."""
        spent: list[float] = []
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield spent
        finally:
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            self.busy_s += wall
            self.busy_cpu_s += cpu
            spent.extend((wall, cpu))

    def add_frames(self, wall_s: float, cpu_s: float, frames: int) -> None:
        for _ in range(frames):
            self.frame_ms.add(wall_s * 1e3 / frames)
            self.frame_cpu_ms.add(cpu_s * 1e3 / frames)

    def add_wait(self, seconds: float, blocked_on_output: bool) -> None:
        if blocked_on_output:
            self.blocked_out_s += seconds
        else:
            self.wait_in_s += seconds

    def wall_s(self) -> float:
        return time.perf_counter() - self.started_s


def poll(poller: zmq.Poller, timeout_ms: float, clock: Clock, blocked_on_output: bool) -> dict:
    t0 = time.perf_counter()
    events = dict(poller.poll(max(0, int(timeout_ms))))
    clock.add_wait(time.perf_counter() - t0, blocked_on_output)
    return events


def worker_stats(args: StageArgs, role: str, threads: dict, clock: Clock, frames: int, drops: DropCounter,
                 **extra) -> dict:
    substages = extra.pop("substages_ms", {})
    return Stats(name=args.name, role=role, incarnation=args.incarnation, pid=os.getpid(), frames=frames,
                 wall_s=clock.wall_s(), busy_s=clock.busy_s, busy_cpu_s=clock.busy_cpu_s,
                 cpu_s=time.process_time() - clock.started_cpu_s, wait_in_s=clock.wait_in_s,
                 blocked_out_s=clock.blocked_out_s, frame_ms=clock.frame_ms.to_dict(),
                 frame_cpu_ms=clock.frame_cpu_ms.to_dict(), substages_ms=substages, exit_usage=own_usage(),
                 extra={"device": args.device, "threads": threads, "dropped_messages": dict(drops.counts),
                        "torch_loaded": "torch" in sys.modules, **extra}).to_message()


def own_usage() -> dict:
    """This process's last sample and its peak resident memory, read by itself as it exits: a
    worker that lives shorter than the sampling interval is still in the report, under its
    name, and its peak is the kernel's high-water mark, not the largest of a few samples."""
    try:
        memory = psutil.Process().memory_full_info()
        rss, pss = memory.rss, getattr(memory, "pss", None)
    except psutil.Error:
        rss = pss = None
    times = os.times()
    return {"sample": [time.perf_counter(), times.user + times.system, rss, pss],
            "peak_rss_bytes": high_water_rss_bytes()}


def high_water_rss_bytes() -> int | None:
    """VmHWM of /proc/self/status: the peak RSS of this process image (since its fork or exec;
    getrusage's ru_maxrss would keep the peak of the image an exec replaced)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 or None
