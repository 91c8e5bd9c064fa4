"""What the runner plans from the host: the cores it may use, and enough frames for a fast device."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from supervisor.prepare import DURATION_FPS_CEILING, plan_source, resolve
from settings.config import RunConfig
from analysis.machine import usable_cores

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_usable_cores_is_the_affinity_mask_not_the_host_count():
    assert usable_cores() == len(os.sched_getaffinity(0))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity masks on this platform")
def test_worker_counts_follow_a_taskset_mask():
    # A run confined to one core (taskset, a cpuset) plans one worker per stage, not one per host core.
    code = ("import os, json; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
            "from supervisor.prepare import resolve; from settings.config import RunConfig;"
            "cfg, machine, _ = resolve(RunConfig());"
            "print(json.dumps([machine.cores, cfg.pre_workers, cfg.infer_workers, cfg.post_workers]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [1, 1, 1, 1]


def test_the_default_machine_has_the_cores_of_the_mask():
    _, machine, _ = resolve(RunConfig())
    assert machine.cores == len(os.sched_getaffinity(0))


def test_a_duration_run_plans_enough_frames_for_a_gpu_pipeline(tmp_path):
    # At 1,000 planned frames a second, a GPU run past 1,000 fps ran out of frames and ended early.
    image = tmp_path / "a.png"
    import cv2
    import numpy as np
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    plan = plan_source(RunConfig(source=str(tmp_path), duration=3.0))
    assert DURATION_FPS_CEILING >= 5_000
    assert plan.total == 3 * DURATION_FPS_CEILING
