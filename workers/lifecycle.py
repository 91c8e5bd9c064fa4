"""What every pipeline process does the same way: take its title and signals, set its thread
counts, log into the run's log with its own tag, beat its heartbeat, listen on the control
channel, notice an orphaning, and account its time as busy, waiting for input, or blocked on
output, in wall and CPU clocks."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil
import zmq

from analysis.printable import PrintableFormatter
from analysis.samples import Samples
from workers.in_hand import poison_named
from workers.messages import DRAIN, HEARTBEAT, PEER_GONE, STOP, validate
from workers.transport import CurveKeys, DropCounter, ProtocolError, make_socket, recv_message, send_message

LOG_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"
TITLE_PREFIX = "yolo-pipeline"
HEARTBEAT_INTERVAL_S = 0.5
CONTROL_TYPES = frozenset({DRAIN, STOP, PEER_GONE})
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal or ssh session closed


@dataclass(frozen=True)
class Endpoints:
    """Where each process binds; consumers connect to the producers' endpoints."""

    pre: tuple[str, ...]
    pre_returns: tuple[str, ...]  # where a preprocess worker takes its shared-memory slots back
    infer: tuple[str, ...]
    collector: str
    control: str
    progress: str
    health: str

    def urls(self) -> list[str]:
        """Every endpoint of the run, each once."""
        return [*self.pre, *self.pre_returns, *self.infer, self.collector, self.control, self.progress, self.health]


def endpoint_names(pre: int, infer: int) -> list[str]:
    """What each bound socket is called (an ipc socket file's name)."""
    return ([f"pre-{i}" for i in range(pre)] + [f"pre-{i}-returns" for i in range(pre)] +
            [f"infer-{i}" for i in range(infer)] + ["collector", "control", "progress", "health"])


def make_endpoints(transport: str, ipc_dir: str, tcp_host: str, tcp_base_port: int, pre: int,
                   infer: int) -> Endpoints:
    names = endpoint_names(pre, infer)
    if transport == "ipc":
        from workers.transport import ipc_endpoint
        urls = {n: ipc_endpoint(ipc_dir, n) for n in names}
    else:
        urls = {n: f"tcp://{tcp_host}:{tcp_base_port + i}" for i, n in enumerate(names)}
    return Endpoints(pre=tuple(urls[f"pre-{i}"] for i in range(pre)),
                     pre_returns=tuple(urls[f"pre-{i}-returns"] for i in range(pre)),
                     infer=tuple(urls[f"infer-{i}"] for i in range(infer)),
                     collector=urls["collector"], control=urls["control"], progress=urls["progress"],
                     health=urls["health"])


@dataclass(frozen=True)
class Wire:
    """The run's security settings for sockets: the token every message starts with, and the
    CURVE keys on tcp (None on ipc, whose sockets live in a private folder)."""

    token: bytes = field(repr=False)
    curve: CurveKeys | None = None


@dataclass(frozen=True)
class StageArgs:
    """Everything a stage process gets at start (pickled by multiprocessing, never on a
    command line: it holds the run's token and keys)."""

    name: str  # e.g. "infer-1"
    index: int
    config: object  # workers.config.RunConfig
    plan: object  # yolo.sources.FramePlan
    endpoints: Endpoints
    wire: Wire
    log_path: str
    run_dir: str
    run_tag: str  # names this run's shared-memory segments
    incarnation: int = 0  # 0, then 1, 2, ... when the runner restarts this worker
    torch_threads: int = 1
    opencv_threads: int = 1
    device: str = "cpu"
    names: tuple[str, ...] = ()  # class names, read once by the runner
    runner_pid: int = 0  # a stage stops if the runner disappears
    start_position: int = 0  # preprocess: ids of its share already handed on by an earlier incarnation
    slot_bytes: int = 0  # preprocess: bytes per shared-memory slot (0: no shared memory)
    slot_count: int = 0
    poison_position: int = -1  # preprocess: the position of a frame that killed it twice: failed, not read
    poison_reason: str = ""
    poison_frames: tuple[tuple[int, str | None], ...] = ()  # infer, post: (id, reason to fail it, or None: suspect)

    @property
    def identity(self) -> str:
        """How peers know this incarnation: a restarted worker is a new peer."""
        return f"{self.name}.{self.incarnation}"


def enter_process(args: StageArgs) -> None:
    """First thing in every stage: its title in ps/top, and its signals. SIGINT (Ctrl-C reaches
    the whole process group) is the runner's to act on, by draining the run; SIGTERM and SIGHUP
    are noted and passed to the runner through the heartbeat, which drains the run the same way.
    The runner starts every process with these signals blocked (supervisor.signals.signals_held):
    one sent during start-up waits until here, where a SIGINT is dropped and a SIGTERM noted."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _note_stop_signal)
    signal.signal(signal.SIGHUP, _note_stop_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    set_title(args.name)


_received_signal: list[str] = []


def _note_stop_signal(signum, frame) -> None:
    if not _received_signal:
        _received_signal.append(signal.Signals(signum).name)


def set_title(name: str) -> None:
    """``yolo-pipeline post-0`` in ps and top, so a user sees which stage uses the CPU."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(f"{TITLE_PREFIX} {name}")


def set_thread_counts(torch_threads: int, opencv_threads: int, use_torch: bool = True) -> dict[str, int]:
    """Before any work, so stages do not oversubscribe the cores. Processes that do not use
    torch (preprocess, collector) never import it: it costs seconds and hundreds of MB."""
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[variable] = str(torch_threads)
    import cv2
    cv2.setNumThreads(opencv_threads)
    counts = {"opencv": cv2.getNumThreads()}
    if use_torch:
        import torch
        torch.set_num_threads(torch_threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set once in this process
            pass
        counts.update(torch=torch.get_num_threads(), interop=torch.get_num_interop_threads())
    return counts


def setup_logging(name: str, log_path: str, level: str) -> logging.Logger:
    root = logging.getLogger()
    root.handlers.clear()
    handler = logging.FileHandler(log_path, mode="a", encoding="utf-8")  # O_APPEND: lines interleave whole
    handler.setFormatter(PrintableFormatter(LOG_FORMAT))
    root.addHandler(handler)  # no console: the runner echoes warnings from run.log above its progress bar
    root.setLevel(level.upper())
    return logging.getLogger(name)


class Control:
    """The runner's broadcast channel (SUB side): drain, stop and peer-gone notices; plus a
    check that the runner still lives."""

    def __init__(self, ctx: zmq.Context, args: StageArgs, drops: DropCounter):
        self.socket = make_socket(ctx, zmq.SUB, linger_ms=0, curve=args.wire.curve)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(args.endpoints.control)
        self.token = args.wire.token
        self.runner_pid = args.runner_pid
        self.parent_pid = os.getppid()  # the runner, or the fork server it started
        self.drops = drops
        self.stop_reason: str | None = None
        self.drain_reason: str | None = None
        self.drain_cancels = True  # frames never read count as cancelled (not after --duration)
        self.gone: list[dict] = []  # peer-gone notices not yet applied by the stage
        self.signal: str | None = None  # the signal that stopped the run (SIGINT, SIGTERM), if one did
        self.role = args.name.rsplit("-", 1)[0]
        self.poison: dict[int, str | None] = dict(args.poison_frames)  # id -> why failed (None: a suspect)

    def check(self) -> bool:
        """Read pending notices without waiting; True if the stage should stop now."""
        while self.socket.poll(0):
            self.handle()
        return self.should_stop()

    def handle(self) -> None:
        try:
            header = validate(recv_message(self.socket, token=self.token).header, CONTROL_TYPES)
        except ProtocolError as exc:
            self.drops.note(exc, "control")
            return
        self.signal = self.signal or header.get("signal")
        if header["type"] == STOP:
            self.stop_reason = self.stop_reason or header["reason"]
        elif header["type"] == DRAIN:
            if self.drain_reason is None:
                self.drain_reason = header["reason"]
                self.drain_cancels = header.get("cancel", True) is not False
        else:
            self.gone.append(header)
            self.poison.update(poison_named(header, self.role))

    def take_gone(self) -> list[dict]:
        gone, self.gone = self.gone, []
        return gone

    def draining(self) -> bool:
        return self.drain_reason is not None or self.should_stop()

    def should_stop(self) -> bool:
        if self.stop_reason is None and not self._runner_alive():
            self.stop_reason = "the runner process is gone"
        return self.stop_reason is not None

    def _runner_alive(self) -> bool:
        if os.getppid() != self.parent_pid:
            return False
        try:
            os.kill(self.runner_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def close(self) -> None:
        self.socket.close()


class Heartbeat:
    """Beats from a thread every HEARTBEAT_INTERVAL_S, so the runner can tell a live process from
    a stopped or frozen one (a stopped process beats no more); each beat says how long ago the
    main loop last ran (a stuck loop), how far a preprocess worker got in its share (where a
    restart resumes), and any SIGTERM received."""

    def __init__(self, ctx: zmq.Context, args: StageArgs):
        self.last_tick = time.perf_counter()
        self.position = args.start_position
        self._ctx, self._args = ctx, args
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def tick(self) -> None:
        self.last_tick = time.perf_counter()

    def _run(self) -> None:
        args = self._args
        socket = make_socket(self._ctx, zmq.PUSH, linger_ms=0, sndhwm=8, curve=args.wire.curve)
        socket.connect(args.endpoints.health)
        try:
            while True:
                beat = {"type": HEARTBEAT, "name": args.name, "incarnation": args.incarnation, "pid": os.getpid(),
                        "loop_age_s": time.perf_counter() - self.last_tick, "position": self.position,
                        "signal": _received_signal[0] if _received_signal else None}
                try:
                    send_message(socket, beat, token=args.wire.token, flags=zmq.NOBLOCK)
                except zmq.Again:  # the runner is not reading (it may be gone): beats are not queued
                    pass
                if self._stop.wait(HEARTBEAT_INTERVAL_S):
                    break
        finally:
            socket.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


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
    return {"type": "stats", "name": args.name, "role": role, "incarnation": args.incarnation, "pid": os.getpid(),
            "device": args.device, "threads": threads, "frames": frames, "busy_s": clock.busy_s,
            "busy_cpu_s": clock.busy_cpu_s, "wait_in_s": clock.wait_in_s, "blocked_out_s": clock.blocked_out_s,
            "wall_s": clock.wall_s(), "frame_ms": clock.frame_ms.to_dict(),
            "frame_cpu_ms": clock.frame_cpu_ms.to_dict(), "cpu_s": time.process_time() - clock.started_cpu_s,
            "dropped_messages": dict(drops.counts), "substages_ms": {}, "torch_loaded": "torch" in sys.modules,
            "exit_usage": own_usage(), **extra}


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


TEST_SLOW_ENV = "YOLO_PIPELINE_TEST_SLOW"  # tests only: "post:30" makes each post frame burn 30 CPU-ms


def test_slowdown_ms(role: str) -> float:
    """The CPU milliseconds a test asked this role to burn per frame (0 outside tests)."""
    spec = os.environ.get(TEST_SLOW_ENV, "")
    for part in spec.split(","):
        stage, _, ms = part.partition(":")
        if stage.strip() == role and ms.strip():
            return float(ms)
    return 0.0


TEST_CRASH_ENV = "YOLO_PIPELINE_TEST_CRASH"  # tests only: "poison" (pre), "infer:poison": die on frames so named


def test_crash(name: str, role: str = "pre") -> None:
    """Die as a decoder or model crash would (tests only): on a frame whose name has ``role``'s text."""
    for part in os.environ.get(TEST_CRASH_ENV, "").split(","):
        stage, _, text = part.partition(":") if ":" in part else ("pre", "", part)
        if stage.strip() == role and text and text in name:
            os._exit(70)


def burn_cpu(ms: float) -> None:
    """Spin on the CPU (not sleep): a slow stage in a test must cost CPU like a real one."""
    end = time.thread_time() + ms / 1e3
    while time.thread_time() < end:
        pass
