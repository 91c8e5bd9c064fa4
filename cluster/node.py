"""The Ray actor on each node: one long-lived runner (today's runner, in a subprocess) reading a
feed that the driver fills through :meth:`NodeRunner.feed`.

Not our supervisor inside the actor: multiprocessing inside a Ray worker has known hangs (ray
issues 28328, 31263, 58967), and the runner as a command is exactly a normal run. The runner
starts under ``cluster.guard`` (it stops when this actor dies; see there) in its own session,
with ``--source feed:DIR`` (one file per preprocess worker) and a private run folder in this
node's temporary folder. Each unit fed goes to the reader with the least work left; the ids fed
to reader ``w``, in order, map its ``k``-th frame (local id ``k * readers + w``) back to a global
id. What the node finished is read from the collector's journal as it grows. The run's outputs
go to the driver in chunks while it runs (:meth:`NodeRunner.pull`, cluster/outbox.py): each
chunk is kept until the next call acknowledges it, and the run's folder goes once the last
one is taken. With ``--results`` in a store the runner writes its images, labels, crops and
videos there itself, under the run's folder and their global names (``--results URL --name
NAME``, its own folder kept here: the ``run_folder`` setting), so the chunks carry none: only
the frames delivered and their detection records. The input frames never leave the node. No
Ray import here: the driver wraps this class with ``ray.remote``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time

from cluster.janitor import start_detached
from cluster.outbox import Outbox
from cluster.reach import unreachable, unwritable
from inputs import kinds  # noqa: F401 - the registry tells the feed which kinds its lines may name (a stored image)
from inputs.feed import END, FEED_PREFIX, FeedEntry, feed_path
from inputs.object_store import is_store_url
from settings.config import RunConfig, config_toml

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RETURNED_FILES = ("report.json", "trace.json")  # with the runner's exit; the rest is pulled
LOG_TAIL_BYTES = 2000  # of the runner's stderr, for the reason of a run that failed


@dataclasses.dataclass
class FeedRun:
    """One runner on its feed: the ids fed to each reader, what the journal says is done."""

    folder: str
    run_dir: str  # the runner's run folder (journal, detection lists, report), in ``folder``
    feeds: list
    ids: list[list[int]]
    started_unix: float
    done: set[int] = dataclasses.field(default_factory=set)  # local ids finished (processed or failed)
    done_by_reader: list[int] = dataclasses.field(default_factory=list)
    outbox: Outbox | None = None
    ended: bool = False

    @property
    def readers(self) -> int:
        return len(self.feeds)

    def left(self, reader: int) -> int:
        return len(self.ids[reader]) - self.done_by_reader[reader]


class NodeRunner:
    """One per node; ``feed``, ``progress`` and ``interrupt`` run while ``finish`` waits (an async actor)."""

    def __init__(self, label: str):
        self.label = label
        self.work_dir = tempfile.mkdtemp(prefix="yolo-pipeline-cluster-")
        start_detached(os.getpid(), self.work_dir, REPO_ROOT)  # removes it if this actor dies between runs
        self.proc: asyncio.subprocess.Process | None = None
        self.waiter: asyncio.Future | None = None
        self.run: FeedRun | None = None
        self.finishing: asyncio.Future | None = None
        self.runs = 0
        self.chunks = 0  # chunks taken, over every run
        self.unacknowledged: dict | None = None  # the last chunk, until the driver says it has it

    async def describe(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "python": sys.executable, "work_dir": self.work_dir}

    async def reach(self, locations: list[str]) -> dict[str, str]:
        """The locations this node cannot read, with why (cluster/reach.py)."""
        found = {location: unreachable(location) for location in locations}
        return {location: reason for location, reason in found.items() if reason}

    async def write_check(self, results: str) -> str | None:
        """Why this node cannot write in the store ``results`` (cluster/reach.py), or None."""
        return unwritable(results)

    async def start(self, config: dict, readers: int) -> None:
        """Start a runner on an empty feed of ``readers`` files."""
        folder = os.path.join(self.work_dir, f"run-{self.runs}")
        self.runs += 1
        feed_dir = os.path.join(folder, "feed")
        os.makedirs(feed_dir)
        feeds = [open(feed_path(feed_dir, reader), "ab", buffering=0) for reader in range(readers)]
        run_dir = os.path.join(folder, *run_place(config))
        self.run = FeedRun(folder, run_dir, feeds, [[] for _ in range(readers)], time.time(),
                           done_by_reader=[0] * readers, outbox=Outbox(run_dir))
        self.finishing = None
        try:
            await self._spawn(config, readers, folder, feed_dir)
        except BaseException:
            self._end_feed(self.run)
            shutil.rmtree(folder, ignore_errors=True)
            self.run = None
            raise

    async def _spawn(self, config: dict, readers: int, folder: str, feed_dir: str) -> None:
        below, name = run_place(config)
        if is_store_url(config["results"]):  # outputs to RESULTS/NAME in the store, its own folder kept here
            place = {"results": config["results"], "run_folder": os.path.join(folder, below)}
        else:
            place = {"results": folder, "run_folder": ""}
        cfg = dataclasses.replace(RunConfig(**config), source=FEED_PREFIX + feed_dir, pre_workers=readers, frames=0,
                                  duration=0.0, name=name, exist_ok=False, json=True, progress=False, **place)
        config_path = os.path.join(folder, "run.toml")
        with open(config_path, "w", encoding="utf-8") as f:
            f.write(config_toml(cfg, f"run {self.runs - 1} on {self.label}"))
        command = [sys.executable, "-m", "cluster.guard", str(os.getpid()), self.work_dir, "--",
                   sys.executable, os.path.join(REPO_ROOT, "runner.py"), "--config", config_path,
                   "--json", "--no-progress"]
        with open(os.path.join(folder, "stderr.log"), "wb") as errors:
            self.proc = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=errors, cwd=REPO_ROOT,
                env=dict(os.environ, PYTHONPATH=REPO_ROOT), start_new_session=True)
        self.waiter = asyncio.ensure_future(self.proc.communicate())

    async def feed(self, units: list[tuple[list[int], dict]]) -> None:
        """Append units (their global ids, their FeedEntry's fields), each to the reader with the
        least work left."""
        run = self.run
        for ids, fields in units:
            reader = min(range(run.readers), key=run.left)
            run.feeds[reader].write(FeedEntry(**fields).line())
            position = len(run.ids[reader])
            run.outbox.fed(fields["name"], [(position + i) * run.readers + reader for i in range(len(ids))], ids)
            run.ids[reader].extend(ids)

    async def progress(self) -> dict:
        """Frames fed and finished so far, and the runner's exit code once it exited."""
        run = self.run
        if run is None or self.proc is None:
            return {"fed": 0, "done": 0, "exit_code": None}
        self._read_journal(run)
        return {"fed": sum(map(len, run.ids)), "done": len(run.done),
                "exit_code": self.proc.returncode if self.proc else None}

    async def finish(self) -> dict | None:
        """End the feed, wait for the runner, return its exit code, summary, files and id map
        (None if no runner was started). A second call gets the same result: the driver may have
        called again when a Ctrl-C came between its call and its noting it."""
        if self.finishing is None:
            if self.run is None:
                return None
            self.finishing = asyncio.ensure_future(self._finish(self.run))
        return await asyncio.shield(self.finishing)

    async def _finish(self, run: FeedRun) -> dict:
        self._end_feed(run)
        stdout, _ = await self.waiter
        finished = time.time()
        files = read_files(run.run_dir)
        run.outbox.finished(json.loads(files["report.json"]) if "report.json" in files else None)
        result = {"exit_code": self.proc.returncode, "stdout": stdout.decode(errors="replace"),
                  "started_unix": run.started_unix, "finished_unix": finished, "ids": run.ids, "files": files,
                  "stderr_tail": _tail(os.path.join(run.folder, "stderr.log"))}
        self.proc, self.waiter = None, None  # the run's folder stays until its outputs are pulled
        return result

    async def pull(self, max_bytes: int, acknowledged: int) -> dict:
        """The next chunk of the run's outputs (cluster/outbox.py), numbered ``seq``; the last one
        again when the driver has not acknowledged it. The chunk that says ``done`` (the runner
        exited and everything went) removes the run's folder."""
        if self.unacknowledged is not None and self.unacknowledged["seq"] > acknowledged:
            return self.unacknowledged
        run = self.run
        if run is None:
            return {"seq": acknowledged, "pieces": [], "frames": [], "records": [], "done": True}
        if not run.outbox.final:
            self._read_journal(run)
        self.chunks += 1
        chunk = dict(run.outbox.take(max_bytes), seq=self.chunks)
        if chunk["done"]:
            shutil.rmtree(run.folder, ignore_errors=True)
            self.run = None
        self.unacknowledged = chunk
        return chunk

    async def interrupt(self) -> bool:
        """Ctrl-C for the runner: the first drains it (a partial report), a second kills."""
        if self.proc is None or self.proc.returncode is not None:
            return False
        self.proc.send_signal(signal.SIGINT)
        return True

    async def close(self) -> None:
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def _end_feed(self, run: FeedRun) -> None:
        if run.ended:
            return
        run.ended = True
        for feed in run.feeds:
            feed.write(END)
            feed.close()

    def _read_journal(self, run: FeedRun) -> None:
        """The frames the collector journaled since the last look."""
        for local in run.outbox.read_journal():
            if local not in run.done:
                run.done.add(local)
                run.done_by_reader[local % run.readers] += 1


def run_place(config: dict) -> tuple[str, str]:
    """(the folder below the runner's private folder where it makes its run folder, that folder's
    name): ``run`` there for a run merged on the driver; ``results/NAME``, the cluster run's
    name, when the outputs go to a store under ``RESULTS/NAME``."""
    return ("results", config["name"]) if is_store_url(config["results"]) else ("", "run")


def read_files(run_dir: str) -> dict[str, bytes]:
    """The run's report and trace, which come back with its exit."""
    files = {}
    for name in RETURNED_FILES:
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                files[name] = f.read()
    return files


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
