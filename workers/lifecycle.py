"""What every worker process does the same way: set its thread counts first, log into the
run's log with its own tag, listen on the control channel, notice an orphaning, and account
its time as busy, waiting for input, or blocked on output."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field

import zmq

from workers.transport import make_socket, recv_message

STOP = "stop"
LOG_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"


@dataclass(frozen=True)
class Endpoints:
    """Where each pool binds; consumers connect to the producers' endpoints."""

    pre: tuple[str, ...]
    infer: tuple[str, ...]
    collector: str
    control: str
    progress: str


def make_endpoints(transport: str, ipc_dir: str, tcp_host: str, tcp_base_port: int, pre: int,
                   infer: int) -> Endpoints:
    names = [f"pre-{i}" for i in range(pre)] + [f"infer-{i}" for i in range(infer)] + \
        ["collector", "control", "progress"]
    if transport == "ipc":
        from workers.transport import ipc_endpoint
        urls = {n: ipc_endpoint(ipc_dir, n) for n in names}
    else:
        urls = {n: f"tcp://{tcp_host}:{tcp_base_port + i}" for i, n in enumerate(names)}
    return Endpoints(pre=tuple(urls[f"pre-{i}"] for i in range(pre)),
                     infer=tuple(urls[f"infer-{i}"] for i in range(infer)),
                     collector=urls["collector"], control=urls["control"], progress=urls["progress"])


def set_thread_counts(torch_threads: int, opencv_threads: int) -> dict[str, int]:
    """First thing in every process, so stages do not oversubscribe the cores. The variables
    are set before torch/OpenCV start their thread pools."""
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[variable] = str(torch_threads)
    import cv2
    import torch
    torch.set_num_threads(torch_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set once in this process
        pass
    cv2.setNumThreads(opencv_threads)
    return {"torch": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
            "opencv": cv2.getNumThreads()}


def setup_logging(name: str, log_path: str, level: str) -> logging.Logger:
    root = logging.getLogger()
    root.handlers.clear()
    handler = logging.FileHandler(log_path, mode="a", encoding="utf-8")  # O_APPEND: lines interleave whole
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)
    console.setFormatter(logging.Formatter(f"{name}: %(levelname)s %(message)s"))
    root.addHandler(console)
    root.setLevel(level.upper())
    return logging.getLogger(name)


class Control:
    """The runner's broadcast channel (SUB side), plus a check that the runner still lives."""

    def __init__(self, ctx: zmq.Context, endpoint: str, parent_pid: int):
        # Ctrl-C reaches the whole process group; only the runner acts on it, by broadcasting a
        # stop, so each stage still reports what it did before it exits.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.socket = make_socket(ctx, zmq.SUB, linger_ms=0)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(endpoint)
        self.parent_pid = parent_pid  # the runner's, passed in: it may already be gone now
        self.stop_reason: str | None = None

    def check(self) -> bool:
        """Read a pending stop without waiting; True if the stage should stop."""
        while self.socket.poll(0):
            self.handle()
        return self.should_stop()

    def handle(self) -> None:
        msg = recv_message(self.socket)
        if msg.header.get("type") == STOP:
            self.stop_reason = msg.header.get("reason", "stopped by the runner")

    def should_stop(self) -> bool:
        if self.stop_reason is None and os.getppid() != self.parent_pid:
            self.stop_reason = "the runner process is gone"
        return self.stop_reason is not None

    def close(self) -> None:
        self.socket.close()


@dataclass
class Clock:
    """Splits a worker's wall time into busy, waiting for input and blocked on output."""

    started_s: float = field(default_factory=time.perf_counter)
    started_cpu_s: float = field(default_factory=time.process_time)  # all threads of the process
    busy_s: float = 0.0
    wait_in_s: float = 0.0
    blocked_out_s: float = 0.0
    frame_ms: list[float] = field(default_factory=list)

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


def worker_stats(name: str, role: str, device: str, threads: dict, clock: Clock, frames: int,
                 **extra) -> dict:
    return {"type": "stats", "name": name, "role": role, "pid": os.getpid(), "device": device,
            "threads": threads, "frames": frames, "busy_s": clock.busy_s, "wait_in_s": clock.wait_in_s,
            "blocked_out_s": clock.blocked_out_s, "wall_s": clock.wall_s(), "frame_ms": clock.frame_ms,
            "cpu_s": time.process_time() - clock.started_cpu_s,
            **extra}


@dataclass(frozen=True)
class StageArgs:
    """Everything a stage process gets at start (pickled by the spawn start method)."""

    name: str  # e.g. "infer-1"
    index: int
    config: object  # workers.config.RunConfig
    plan: object  # yolo.sources.FramePlan
    endpoints: Endpoints
    log_path: str
    run_dir: str
    torch_threads: int = 1
    opencv_threads: int = 1
    device: str = "cpu"
    names: tuple[str, ...] = ()  # class names, read once by the runner
    parent_pid: int = 0  # the runner; a stage stops if it disappears
