"""What the runner shows on the terminal while a run goes: a start-up line, then a frame bar
whose rate is the pipeline's measured fps, and the warnings of every process printed above the
bar (stages log only to run.log; the runner echoes their warnings from there)."""

from __future__ import annotations

import logging
import os
import sys
import time

from tqdm import tqdm

from analysis.printable import PrintableFormatter
from backends.registry import backend_spec
from settings.config import RunConfig
from yolo.precision import choose_precision
from yolo.presets import MODEL_FREE

ECHO_LEVELS = (" WARNING ", " ERROR ", " CRITICAL ")
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class Console:
    def __init__(self, show_progress: bool, total: int | None, log_path: str, stream=None):
        self.show_progress = show_progress
        self.total = total
        self.log_path = log_path
        self.stream = stream or sys.stderr
        self.bar: tqdm | None = None
        self._offset = 0
        self._echoing = False  # inside a multi-line record (a traceback) being echoed
        self._first_done_s: float | None = None
        self._first_done = 0

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def progress(self, processed: int, failed: int) -> None:
        if not self.show_progress:
            return
        if self.bar is None:
            self.bar = tqdm(total=self.total, unit="frame", dynamic_ncols=True, file=self.stream, bar_format=BAR_FORMAT)
        done = processed + failed
        now = time.perf_counter()
        if self._first_done_s is None and done:
            self._first_done_s, self._first_done = now, done
        self.bar.update(done - self.bar.n)
        rate = (done - self._first_done) / (now - self._first_done_s) if self._first_done_s and now > self._first_done_s else 0.0
        # the time left at the pipeline's own rate since its first frame (start-up left out)
        eta = f", ETA {tqdm.format_interval((self.total - done) / rate)}" if self.total and rate > 0 else ""
        self.bar.set_postfix_str(f"{rate:.1f} fps{eta}, failed {failed}", refresh=False)

    def finish(self, fps: float | None) -> None:
        """Close the bar showing the run's measured fps, the figure the summary gives."""
        if self.bar is not None:
            # the summary's figure, or none: a rate counted over warm-up frames would contradict it
            self.bar.set_postfix_str(f"{fps:.1f} fps measured" if fps is not None else "fps n/a", refresh=False)
            self.bar.close()
            self.bar = None

    def echo_worker_logs(self) -> None:
        """Print the warnings and errors other processes wrote to run.log since the last call
        (called a few times a second: a stat, and the file opened only when it grew)."""
        try:
            if os.stat(self.log_path).st_size <= self._offset:
                return
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except OSError:
            return
        own = f"[{os.getpid()}]"
        for line in chunk.splitlines():
            if _is_record_start(line):
                self._echoing = own not in line.split(" ", 3)[2] and any(level in line for level in ECHO_LEVELS)
            if self._echoing:
                self.say(_short(line))


def _is_record_start(line: str) -> bool:
    # "2026-12-03 08:07:09,123 infer-0[4242] WARNING ...": a date starts every record
    return len(line) > 23 and line[4] == "-" and line[7] == "-" and line[10] == " " and line[13] == ":"


def _short(line: str) -> str:
    if not _is_record_start(line):
        return line
    parts = line.split(" ", 4)  # date, time, name[pid], level, message
    if len(parts) < 5:
        return line
    name = parts[2].split("[", 1)[0]
    return f"{name}: {parts[3].lower()}: {parts[4]}"


class ConsoleHandler(logging.Handler):
    """The runner's own log lines, printed above the bar."""

    def __init__(self, console: Console, level=logging.INFO):
        super().__init__(level)
        self.console = console
        self.setFormatter(PrintableFormatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.say(self.format(record))
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def model_words(cfg: RunConfig) -> str:
    """The model, its precision and the backend, as the start line says them."""
    if cfg.preset == MODEL_FREE and not cfg.weights:
        return "no model (--preset none)"
    model = os.path.basename(cfg.weights) if cfg.weights else f"random-weight {cfg.preset}"
    precision = choose_precision(cfg.devices[0] if cfg.devices else cfg.device, cfg.half)
    spec = backend_spec(cfg.backend)
    autocast = " autocast" if precision == "bf16" and spec.autocast else ""
    return f"{model} in {precision}{autocast} ({spec.title})"
