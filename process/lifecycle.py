"""What every pipeline process does first: take its title and its signals, set its thread counts,
and log into the run's log with its own tag."""

from __future__ import annotations

import logging
import os
import signal

from analysis.printable import PrintableFormatter
from topology.plugins import load_plugins

LOG_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"
TITLE_PREFIX = "yolo-pipeline"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal or ssh session closed


class ReceivedSignals:
    """The first SIGTERM or SIGHUP this process received, for its heartbeat to pass to the runner."""

    def __init__(self):
        self.received: list[str] = []

    def note(self, signum, frame=None) -> None:
        if not self.received:
            self.received.append(signal.Signals(signum).name)

    def first(self) -> str | None:
        return self.received[0] if self.received else None


def enter_process(args) -> ReceivedSignals:
    """First thing in every stage: its title in ps/top, and its signals. SIGINT (Ctrl-C reaches
    the whole process group) is the runner's to act on, by draining the run; SIGTERM and SIGHUP
    are noted and passed to the runner through the heartbeat, which drains the run the same way.
    The runner starts every process with these signals blocked (supervisor.signals.signals_held):
    one sent during start-up waits until here, where a SIGINT is dropped and a SIGTERM noted."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    received = ReceivedSignals()
    signal.signal(signal.SIGTERM, received.note)
    signal.signal(signal.SIGHUP, received.note)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    set_title(args.name)
    load_plugins()  # inherited YOLO_PIPELINE_PLUGINS: the stages, backends and input kinds the runner saw
    return received


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
