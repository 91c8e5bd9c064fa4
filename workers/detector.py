"""The model side of an inference process: the backend loaded for this run, how a batch of
frames runs on it (padded to its bucket on a GPU, the first forward of each input shape told
apart as set-up, the shapes warmed before a run), and the per-module times folded as it goes."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from analysis.samples import Samples
from backends.registry import load_backend
from wire.wiring import StageArgs
from yolo.detect import DetectOptions
from yolo.letterbox import LETTERBOX_STRIDE
from yolo.precision import choose_precision
from yolo.presets import MODEL_FREE
from yolo.tensors import batch_bucket

NO_CANDIDATES = np.zeros((0, 6), np.float32)


class Detector:
    """The backend and what a batch needs around it: the padded row count, first forwards of a
    shape told apart, the steps' times."""

    def __init__(self, args: StageArgs):
        cfg = args.config
        self.device = torch.device(args.device)
        if self.device.type == "cuda":  # this process's current device: its streams, graphs and syncs are there
            torch.cuda.set_device(self.device)
        self.backend = None
        self.precision = choose_precision(self.device, cfg.half)
        if cfg.preset != MODEL_FREE or cfg.weights:
            logging.getLogger("yolo.model").setLevel(logging.ERROR)  # the runner already warned of random weights
            options = cfg.backend_options(args.device, self.precision, args.torch_threads)
            self.backend = load_backend(cfg.backend, options)
            if self.backend.max_stride != LETTERBOX_STRIDE:
                raise RuntimeError(f"expected a model of max stride {LETTERBOX_STRIDE}, got {self.backend.max_stride}")
        else:
            self.precision = "none"
        self.timing = self.backend.timing if self.backend else None
        self.opts: DetectOptions = cfg.detect_options()
        self.batch_size = cfg.batch_size
        self.shapes_seen: set[tuple] = set()

    def candidates(self, images: list[np.ndarray], substages: dict, measured: bool) -> tuple[list[np.ndarray], bool]:
        """Per image (K, 6) candidate rows, and whether this was the first forward of its input
        shape here (slow one-off set-up: excluded from statistics). On a GPU a partial batch runs
        padded to its bucket (``batch_bucket``), so new input shapes stay few."""
        rows = batch_bucket(len(images), self.batch_size) if self.device.type == "cuda" else len(images)
        shape = (rows,) + images[0].shape
        cold = shape not in self.shapes_seen
        self.shapes_seen.add(shape)
        on_device = isinstance(images[0], torch.Tensor)
        if self.backend is None:
            none = torch.zeros((0, 6), dtype=torch.float32, device=self.device) if on_device else NO_CANDIDATES
            return [none] * len(images), cold
        self.backend.set_measuring(measured and not cold)
        run = self.backend.run_device_batch if on_device else self.backend.run_batch
        found, steps = run(images, rows, self.opts)
        if measured and not cold:
            for step, seconds in steps.items():
                substages[step].add(seconds * 1e3)
        return found, cold

    def warm(self, shapes: list[tuple[int, int, int]], on_device: bool) -> tuple[int, float, str]:
        """Run a forward of each ``(rows, h, w)`` batch shape, so that no measured batch pays a
        shape's one-off set-up (cuDNN plans, allocator pools, CUDA graphs: about 250 ms each on a
        GPU); ``on_device``: as the device data path calls the backend. Warming stops at the first
        shape the device has no memory for (the run then meets the rest cold). Returns the shapes
        warmed, the seconds spent, and why it stopped early ("" if it did not)."""
        if self.backend is None:
            return 0, 0.0, ""
        t0 = time.perf_counter()
        self.backend.set_measuring(False)
        warmed = 0
        for rows, h, w in shapes:
            if (rows, 3, h, w) in self.shapes_seen:
                continue
            try:
                if on_device:
                    self.backend.run_device_batch([torch.zeros((3, h, w), dtype=torch.uint8, device=self.device)],
                                                  rows, self.opts)
                else:
                    self.backend.run_batch([np.zeros((3, h, w), np.uint8)], rows, self.opts)
            except torch.OutOfMemoryError as exc:
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                return warmed, time.perf_counter() - t0, out_of_memory_words(exc, f"a batch of {rows}x3x{h}x{w}")
            self.shapes_seen.add((rows, 3, h, w))
            warmed += 1
        return warmed, time.perf_counter() - t0, ""

    def device_usage(self, busy_s: float) -> dict | None:
        """On a GPU: the seconds its measured batches took (launch to results on the host: what
        the device was busy with, at most), and the device memory this process used at peak
        (torch's allocator) out of the device's total. None on a CPU."""
        if self.device.type != "cuda":
            return None
        return {"device": str(self.device), "busy_s": busy_s,
                "memory_peak_bytes": torch.cuda.max_memory_allocated(self.device),
                "memory_reserved_peak_bytes": torch.cuda.max_memory_reserved(self.device),
                "memory_total_bytes": torch.cuda.get_device_properties(self.device).total_memory}

    @property
    def backend_name(self) -> str:
        return self.backend.name if self.backend is not None else "none"

    def log_line(self) -> str:
        if self.backend is None:
            return "no model (--preset none): every frame gets no detections at once"
        return self.backend.log_line()


def out_of_memory_words(exc: BaseException, running: str) -> str:
    """What a device out of memory says: what was running, and what the device said it asked for."""
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
    return f"device out of memory running {running} ({said[:200]})"


class ModuleTimes:
    """Folds the recorder's per-module times into compact summaries every FOLD_EVERY forwards,
    so an inference process's memory stays flat however long the run."""

    FOLD_EVERY = 64

    def __init__(self, timing):
        self.timing = timing
        self.modules: dict[str, Samples] = {}
        self.forward, self.residual = Samples(), Samples()
        self._since_fold = 0

    def after_forward(self) -> None:
        self._since_fold += 1
        if self.timing is not None and self._since_fold >= self.FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        self._since_fold = 0
        times, forward, residual = self.timing.recorder.take_times()
        for name, values in times.items():
            self.modules.setdefault(name, Samples()).extend(values)
        self.forward.extend(forward)
        self.residual.extend(residual)

    def export(self) -> dict | None:
        if self.timing is None:
            return None
        self.fold()
        exported = self.timing.recorder.export()
        exported["forward_ms"] = self.forward.to_dict()
        exported["residual_ms"] = self.residual.to_dict()
        for m in exported["modules"]:
            m["times_ms"] = self.modules.get(m["name"], Samples()).to_dict()
        exported["spans"] = [list(s) for s in self.timing.recorder.spans]
        return exported
