"""The Ray actor on each node: runs one chunk at a time as today's runner, in a subprocess.

Not our supervisor inside the actor: multiprocessing inside a Ray worker has known hangs (ray
issues 28328, 31263, 58967), and the runner as a command is exactly a normal run. The runner
starts under ``cluster.guard`` (it stops when this actor dies; see there) in its own session,
with a private run folder in this node's temporary folder. Its outputs come back to the driver
as bytes through Ray: the reports, detections and annotated images are small, the input frames
never leave the node. No Ray import here: the driver wraps this class with ``ray.remote``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import socket
import sys
import tempfile
import time

from workers.config import RunConfig, config_toml

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RETURNED_FILES = ("report.json", "detections.json", "trace.json")
RETURNED_DIRS = ("images", "videos", "labels", "crops")
LOG_TAIL_BYTES = 2000  # of the runner's stderr, for the reason of a chunk that failed


class NodeRunner:
    """One per node; ``run_chunk`` and ``interrupt`` may run at once (an async actor)."""

    def __init__(self, label: str):
        self.label = label
        self.work_dir = tempfile.mkdtemp(prefix="yolo-pipeline-cluster-")
        self.proc: asyncio.subprocess.Process | None = None
        self.interrupts = 0

    async def describe(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "python": sys.executable}

    async def run_chunk(self, index: int, config: dict, list_text: str, synthetic: int) -> dict:
        """Run chunk ``index``: ``list_text`` as a .txt source, or ``synthetic`` generated frames.
        Returns the exit code, the runner's JSON summary, the run folder's files and timings."""
        folder = os.path.join(self.work_dir, f"chunk-{index}")
        os.makedirs(folder)
        source = "synthetic"
        if not synthetic:
            source = os.path.join(folder, "source.txt")
            with open(source, "w", encoding="utf-8") as f:
                f.write(list_text)
        cfg = dataclasses.replace(RunConfig(**config), source=source, synthetic_count=max(synthetic, 1), frames=0,
                                  duration=0.0, results=folder, name="run", exist_ok=False, json=True, progress=False)
        config_path = os.path.join(folder, "chunk.toml")
        with open(config_path, "w", encoding="utf-8") as f:
            f.write(config_toml(cfg, f"chunk {index} on {self.label}"))
        started = time.time()
        with open(os.path.join(folder, "stderr.log"), "wb") as errors:
            code, stdout = await self._run(config_path, errors)
        finished = time.time()
        result = {"exit_code": code, "stdout": stdout.decode(errors="replace"), "started_unix": started,
                  "finished_unix": finished, "files": read_outputs(os.path.join(folder, "run")),
                  "stderr_tail": _tail(os.path.join(folder, "stderr.log"))}
        shutil.rmtree(folder, ignore_errors=True)
        return result

    async def _run(self, config_path: str, errors) -> tuple[int, bytes]:
        command = [sys.executable, "-m", "cluster.guard", str(os.getpid()), self.work_dir, "--",
                   sys.executable, os.path.join(REPO_ROOT, "runner.py"), "--config", config_path,
                   "--json", "--no-progress"]
        env = dict(os.environ, PYTHONPATH=REPO_ROOT)
        self.interrupts = 0
        self.proc = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, stderr=errors,
                                                         cwd=REPO_ROOT, env=env, start_new_session=True)
        try:
            stdout, _ = await self.proc.communicate()
            return self.proc.returncode, stdout
        finally:
            self.proc = None

    async def interrupt(self) -> bool:
        """Ctrl-C for the running chunk: the first drains it (a partial report), a second kills."""
        if self.proc is None or self.proc.returncode is not None:
            return False
        self.interrupts += 1
        self.proc.send_signal(signal.SIGINT)
        return True

    async def close(self) -> None:
        shutil.rmtree(self.work_dir, ignore_errors=True)


def read_outputs(run_dir: str) -> dict[str, bytes]:
    """The run folder's files the driver merges, by path relative to the folder."""
    files = {}
    for name in RETURNED_FILES:
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                files[name] = f.read()
    for top in RETURNED_DIRS:
        for root, _dirs, names in os.walk(os.path.join(run_dir, top)):
            for name in names:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, run_dir)] = f.read()
    return files


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
