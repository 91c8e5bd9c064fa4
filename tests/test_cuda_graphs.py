"""``--cuda-graphs``: the forward replayed as a CUDA graph per input shape equals the eager forward,
across shapes and inputs, and a pipeline run with it loses no frame (on a GPU); without CUDA it is
refused before the run, naming the device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import runner
from backends.cuda_graphs import GraphedForward
from tests.conftest import REPO_ROOT

def test_cuda_graphs_are_refused_without_cuda(tmp_path, caplog):
    code = runner.main(["--results", str(tmp_path), "--preset", "none", "--frames", "2", "--cuda-graphs",
                        "--no-progress"])
    assert code == 2
    assert "--cuda-graphs: expected a CUDA device (a CUDA graph replays GPU kernels), got device 'cpu'" in caplog.text
    with pytest.raises(ValueError, match="expected a CUDA device for CUDA graphs, got cpu"):
        GraphedForward(torch.nn.Identity(), torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA)")
@pytest.mark.parametrize("half", [False, True])
def test_a_replayed_graph_gives_the_eager_forwards_output(half):
    from yolo.checkpoint import load_model
    model = load_model(None, preset="yolov5n", device=torch.device("cuda"), precision="fp16" if half else "fp32")
    graphed = GraphedForward(model, torch.device("cuda"))
    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        for shape in ((1, 3, 640, 480), (4, 3, 384, 640), (1, 3, 640, 480)):
            x = torch.rand(shape, device="cuda", generator=generator).to(model.input_dtype)
            eager = model(x).clone()
            replayed = graphed(x).clone()
            torch.testing.assert_close(replayed, eager, rtol=1e-3 if half else 1e-4, atol=1e-2 if half else 1e-3)
    assert len(graphed.graphs) == 2 and graphed.eager_calls == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA)")
def test_a_pipeline_with_cuda_graphs_loses_no_frame(tmp_path, yolov5n_path, fixtures_dir):
    done = subprocess.run([sys.executable, "runner.py", "--weights", str(yolov5n_path), "--source", str(fixtures_dir),
                           "--frames", "40", "--device", "cuda", "--batch-size", "4", "--cuda-graphs", "--json",
                           "--no-progress", "--results", str(tmp_path)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert (summary["processed"], summary["failed"], summary["lost"]) == (40, 0, 0)
    assert "per-module timing is off" in done.stderr
