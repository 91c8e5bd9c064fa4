"""A live run of runner.py for fault and signal tests: started as a subprocess the way a terminal
starts a job (its own session and process group, Ctrl-C at its default), watched through the
files it writes and the processes of its session, and checked for what it leaves behind.

Each run gets its own short temporary folder as TMPDIR (the runner's ipc folder goes there, and
unix socket paths are limited to about 100 bytes), so "no temp folder left" is a check of that
folder being empty.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from process.lifecycle import TITLE_PREFIX
from sharedmem.slots import SEGMENT_PREFIX, SHM_DIR

REPO = Path(__file__).resolve().parent.parent
RUN_NAME = "run"
SMALL_RUN = ("--imgsz", "64", "--workers", "1", "--infer-workers", "1", "--no-progress")
EXIT_TIMEOUT_S = 120.0
TORCH_CACHE_PREFIX = "torchinductor_"  # torch's compile cache, made in TMPDIR at import and kept on purpose


def _default_sigint() -> None:
    # A shell's background job, and a subprocess of pytest, may start with SIGINT ignored; an
    # ignored disposition survives exec, and the runner must see Ctrl-C as a terminal sends it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class LiveRun:
    proc: subprocess.Popen
    results: Path
    tmpdir: Path
    out_path: Path
    err_path: Path
    name: str = RUN_NAME
    _runner_pid: int | None = None

    # -- what it wrote -------------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return self.results / self.name

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def log(self) -> str:
        path = self.run_dir / "run.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def report(self) -> dict:
        with open(self.run_dir / "report.json") as f:
            return json.load(f)

    def images(self) -> int:
        folder = self.run_dir / "images"
        return sum(1 for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0

    def ipc_dirs(self) -> list[Path]:
        return sorted(self.tmpdir.glob("yolo-*"))

    @property
    def runner_pid(self) -> int:
        """The runner's pid: the session leader, or (run inside a shell) the process running runner.py."""
        if self._runner_pid is None:
            self._runner_pid = self.proc.pid
            for process in self.processes():
                try:
                    if any(part.endswith("runner.py") for part in process.cmdline()):
                        self._runner_pid = process.pid
                except psutil.Error:
                    continue
        return self._runner_pid

    def segments(self) -> list[str]:
        prefix = f"{SEGMENT_PREFIX}{self.runner_pid}-"
        return [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]

    # -- its processes -------------------------------------------------------------------------------
    def processes(self) -> list[psutil.Process]:
        """Every live process of the run's session but the runner: its stages, the fork server, the
        resource tracker. A child that left the session would escape this; none does."""
        found = []
        for process in psutil.process_iter(["pid"]):
            try:
                if process.pid != self.proc.pid and os.getsid(process.pid) == self.proc.pid \
                        and process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
            except (ProcessLookupError, psutil.Error, OSError):
                continue
        return found

    def stage(self, name: str) -> psutil.Process | None:
        """The live process titled ``yolo-pipeline <name>`` (e.g. infer-0), if any."""
        title = f"{TITLE_PREFIX} {name}"
        for process in self.processes():
            try:
                if " ".join(process.cmdline()).strip() == title:
                    return process
            except psutil.Error:
                continue
        return None

    # -- waiting -------------------------------------------------------------------------------------
    def wait_until(self, check, timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            if self.proc.poll() is not None:
                raise AssertionError(f"the runner exited ({self.proc.returncode}) before {what}\n{self.stderr()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.stderr()[-3000:]}")

    def wait_for_log(self, text: str, timeout_s: float = 60.0) -> None:
        self.wait_until(lambda: text in self.log(), timeout_s, f"{text!r} in run.log")

    def wait_for_images(self, count: int, timeout_s: float = 60.0) -> None:
        self.wait_until(lambda: self.images() >= count, timeout_s, f"{count} saved images")

    def wait_for_stage(self, name: str, timeout_s: float = 60.0) -> psutil.Process:
        return self.wait_until(lambda: self.stage(name), timeout_s, f"the process {name}")

    def wait(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the runner did not exit in {timeout_s:.0f} s\n{self.stderr()[-3000:]}") from None

    # -- signals -------------------------------------------------------------------------------------
    def ctrl_c(self) -> None:
        """What a terminal does on Ctrl-C: SIGINT to the whole foreground process group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def signal_group(self, signum: int) -> None:
        os.killpg(self.proc.pid, signum)

    def signal_runner(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        """Test clean-up: end whatever is left of the run's session."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)

    # -- what it left --------------------------------------------------------------------------------
    def assert_clean(self) -> None:
        """No process of the run left, no ipc folder, no shared-memory segment, nothing in its
        temporary folder, and results/latest (if any) points at a run folder with a report."""
        assert self.proc.poll() is not None, "the runner still runs"
        deadline = time.monotonic() + 5.0
        while self.processes() and time.monotonic() < deadline:  # orphans being reaped by init
            time.sleep(0.1)
        left = [(p.pid, _describe(p)) for p in self.processes()]
        assert not left, f"processes left behind: {left}"
        assert not self.segments(), f"shared-memory segments left: {self.segments()}"
        assert not self.ipc_dirs(), f"ipc folders left: {self.ipc_dirs()}"
        left_files = [p for p in self.tmpdir.iterdir() if not p.name.startswith(TORCH_CACHE_PREFIX)]
        assert not left_files, f"temporary files left: {left_files}"
        latest = self.results / "latest"
        if os.path.lexists(latest):
            assert latest.is_symlink(), "results/latest is not a link"
            assert (latest / "report.json").is_file(), f"results/latest -> {os.readlink(latest)} has no report"
        for folder in self.results.iterdir() if self.results.is_dir() else ():
            if folder.is_dir() and not folder.is_symlink() and folder.name != "latest":
                assert (folder / "report.json").is_file() or not any(folder.iterdir()), \
                    f"a run folder without a report: {sorted(p.name for p in folder.iterdir())}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _describe(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:120]
    except psutil.Error:
        return "?"


def start_run(tmp_path: Path, *flags: str, env: dict | None = None, name: str = RUN_NAME,
              shell: list[str] | None = None, script: str = "", results: Path | None = None) -> LiveRun:
    """Start ``runner.py --results tmp_path/results --name run *flags`` in its own session.

    With ``shell`` (e.g. ``["unshare", "-rm", "sh", "-c"]``) the runner runs inside ``script``,
    where ``{runner}`` stands for its quoted command line; ``env`` adds environment variables."""
    results = results or tmp_path / "results"
    tmpdir = Path(tempfile.mkdtemp(prefix="lr-", dir="/tmp"))
    command = [sys.executable, str(REPO / "runner.py"), "--results", str(results), "--name", name, *flags]
    if shell:
        command = [*shell, script.format(runner=shlex.join(command))]
    out_path, err_path = tmp_path / f"{name}.stdout", tmp_path / f"{name}.stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env={**os.environ, "TMPDIR": str(tmpdir), **(env or {})},
                                start_new_session=True, preexec_fn=_default_sigint)
    return LiveRun(proc, results, tmpdir, out_path, err_path, name)


def frame_counts(report: dict) -> tuple[int, int, int, int]:
    """(in, processed, failed, cancelled) of a run's report."""
    frames = report["frames"]
    return frames["in"], frames["processed"], frames["failed"], frames["cancelled"]
