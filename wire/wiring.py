"""What a stage process is given at start: where every socket of the run is (made from the stage
table, topology.stages), the run's security settings, and its own arguments."""

from __future__ import annotations

from dataclasses import dataclass, field

from topology.stages import endpoint_names, process_names, producer_of
from wire.transport import CurveKeys, ipc_endpoint


@dataclass(frozen=True)
class Endpoints:
    """Where each process binds, by endpoint name (``pre-0``, ``pre-0-returns``, ``infer-1``,
    ``collector``, ``control``, ...); consumers connect to the producers' endpoints."""

    counts: dict[str, int]  # processes per stage kind
    by_name: dict[str, str]  # endpoint name -> url

    def __getitem__(self, name: str) -> str:
        return self.by_name[name]

    def urls(self) -> list[str]:
        """Every endpoint of the run, each once."""
        return list(self.by_name.values())

    def producers(self, role: str) -> tuple[list[str], list[str]]:
        """(names, urls) of the processes a ``role`` process takes frames from."""
        names = process_names(self.counts, producer_of(role))
        return names, [self.by_name[name] for name in names]

    def of_pool(self, role: str, suffix: str = "") -> list[str]:
        """The url each ``role`` process binds under its name + ``suffix``, in index order."""
        return [self.by_name[name + suffix] for name in process_names(self.counts, role)]


def make_endpoints(transport: str, ipc_dir: str, tcp_host: str, tcp_base_port: int,
                   counts: dict[str, int]) -> Endpoints:
    names = endpoint_names(counts)
    if transport == "ipc":
        urls = {n: ipc_endpoint(ipc_dir, n) for n in names}
    else:
        urls = {n: f"tcp://{tcp_host}:{tcp_base_port + i}" for i, n in enumerate(names)}
    return Endpoints(dict(counts), urls)


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
    config: object  # settings.config.RunConfig
    plan: object  # inputs.sources.FramePlan
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
    workers: tuple[str, ...] = ()  # collector: every frame stage's process, whose summaries it waits for
    runner_started_s: float = 0.0  # collector: when the runner started (the report's start-up time)
    machine: dict = field(default_factory=dict)  # collector: analysis.machine.Machine.as_dict()
    resume: object = None  # a restarted collector: collector.journal.Resume

    @property
    def identity(self) -> str:
        """How peers know this incarnation: a restarted worker is a new peer."""
        return f"{self.name}.{self.incarnation}"
