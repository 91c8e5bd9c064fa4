"""Every benchmark script starts: ``--help`` exits 0. A benchmark runs where a GPU is lent, once,
with minutes of device time: an import broken by a move elsewhere in benchmarks/ (bench_gpu.py
and bench_cores.py once imported a function bench_pipeline.py no longer had) must show here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_starts(script):
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()


def test_the_gpu_check_script_parses():
    done = subprocess.run(["bash", "-n", "benchmarks/gpu_check.sh"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
