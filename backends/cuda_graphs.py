"""``--cuda-graphs``: the model's forward captured once per input shape as a CUDA graph and replayed.

A yolov5n forward at batch 1 is a few hundred small kernels; launching them one by one from
Python costs more host time than the GPU spends on them. A CUDA graph launches the whole
sequence at once. Each input shape (a batch bucket of a letterboxed shape: the shapes the
inference process warms before a run) gets its own graph, captured after a few eager forwards on
a side stream (as torch's documentation asks: allocator pools and cuDNN plans settle first), all
sharing one memory pool.

What a graph changes: the forward writes into the same output tensor at every replay of a shape,
so a caller takes what it needs of one result (the candidates, copied or indexed out) before the
next forward; and Python code inside the forward runs at capture only, so the per-module timing
hooks (yolo.timing) cannot time a replay: the run's module timing is off with ``--cuda-graphs``
(supervisor/prepare.py says so), and the forward is timed whole. A graph also reads the tensors
the forward made at capture (Detect's cached grids) at their addresses, so Detect stops evicting
its grid cache once graphs replay it.
"""

from __future__ import annotations

from typing import Callable

import torch

WARMUP_FORWARDS = 3  # eager forwards on a side stream before a shape's capture
MAX_GRAPHS = 64  # shapes captured; past this, further shapes run eagerly (each graph holds its output)


class GraphedForward:
    """Calls ``model`` like itself, through a CUDA graph per input shape."""

    def __init__(self, model: Callable[[torch.Tensor], torch.Tensor], device: torch.device):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"expected a CUDA device for CUDA graphs, got {device}")
        self.model, self.device = model, device
        for module in getattr(model, "modules", lambda: ())():
            if hasattr(module, "evict_grids"):  # a graph reads Detect's cached grids at their captured addresses
                module.evict_grids = False
        self.graphs: dict[tuple, tuple[torch.Tensor, torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None  # one memory pool for every graph (torch.cuda.graph_pool_handle)
        self.eager_calls = 0  # forwards of shapes past MAX_GRAPHS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= MAX_GRAPHS:
                self.eager_calls += 1
                return self.model(x)
            entry = self.graphs[key] = self._capture(x)
        static_in, graph, static_out = entry
        static_in.copy_(x, non_blocking=True)
        graph.replay()
        return static_out

    def _capture(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.CUDAGraph, torch.Tensor]:
        with torch.cuda.device(self.device):  # the capture stream on this device, whatever the current one
            return self._capture_here(x)

    def _capture_here(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.CUDAGraph, torch.Tensor]:
        static_in = x.clone()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_FORWARDS):
                self.model(static_in)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = self.model(static_in)
        return static_in, graph, static_out
