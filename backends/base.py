"""What every inference backend is: a loaded model called alike (a float batch in, decoded
predictions out), its precision, its per-module times, and one log line. The steps of a batch
around the forward (to the device, candidate rows out) are the same for every backend."""

from __future__ import annotations

import time

import numpy as np
import torch

from backends.options import BackendOptions
from yolo.detect import DetectOptions, candidates_for_batch
from yolo.nms import select_candidates
from yolo.devices import synchronizer
from yolo.tensors import BatchInput, chw_batch_to_input


class Backend:
    """A loaded model (called like a torch module) and its per-module timing (None when off)."""

    name = "base"

    def __init__(self, model, timing, options: BackendOptions):
        self.model, self.timing, self.options = model, timing, options
        self.device = torch.device(options.device)
        self.precision = model.precision
        self.max_stride = model.max_stride
        self.to_batch = BatchInput(self.device, model.input_dtype, options.batch_size)
        self.forward = model  # the model's call, or its CUDA graphs (--cuda-graphs)
        if options.cuda_graphs:
            from backends.cuda_graphs import GraphedForward
            self.forward = GraphedForward(model, self.device)

    def run_batch(self, images: list[np.ndarray], rows: int,
                  opts: DetectOptions) -> tuple[list[np.ndarray], dict[str, float]]:
        """Candidate rows (K, 6) per image, and the seconds of each step: to the device, the
        forward, the candidates' selection. ``rows`` > len(images) pads the batch (dropped)."""
        t_start = time.perf_counter()
        with torch.inference_mode():
            x = self.to_batch(images, rows)
            t_device = time.perf_counter()
            prediction = self.forward(x)[:len(images)]
            t_forward = time.perf_counter()
            found = candidates_for_batch(prediction, opts)  # .cpu() here waits for a GPU
        t_end = time.perf_counter()
        steps = {"to_device": t_device - t_start, "forward": t_forward - t_device, "select": t_end - t_forward}
        return [c.numpy() for c in found], steps

    def run_device_batch(self, images: list[torch.Tensor], rows: int,
                         opts: DetectOptions) -> tuple[list[torch.Tensor], dict[str, float]]:
        """:meth:`run_batch` for frames already on the device (``--data-path device``): uint8
        Tensor[3, H, W] of one shape in, per image its candidate rows Tensor[K, 6] float32 left
        on the device (NMS runs there; only the kept rows cross to the host)."""
        sync = synchronizer(self.device)
        t_start = time.perf_counter()
        with torch.inference_mode():
            batch = torch.stack(list(images) + [images[-1]] * (rows - len(images)))
            x = chw_batch_to_input(batch, self.device, self.model.input_dtype)
            sync()
            t_device = time.perf_counter()
            prediction = self.forward(x)[:len(images)]
            sync()
            t_forward = time.perf_counter()
            found = [select_candidates(p, opts.conf_thres).float() for p in prediction]
            sync()
        t_end = time.perf_counter()
        steps = {"to_device": t_device - t_start, "forward": t_forward - t_device, "select": t_end - t_forward}
        return found, steps

    def set_measuring(self, measuring: bool) -> None:
        if self.timing is not None:
            self.timing.recorder.measuring = measuring

    def engine_words(self) -> str:
        """The engine and its version, as the log line says them."""
        return f"torch {torch.__version__}"

    def log_line(self) -> str:
        mode = self.timing.recorder.mode if self.timing else "off"
        return (f"model on {self.device}: {self.model.num_params()} parameters, {self.precision}, "
                f"{self.engine_words()}, timing {mode}")
