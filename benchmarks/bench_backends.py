"""One forward on each inference backend, side by side in one process: torch and OpenVINO, fp32
and bf16 (where the CPU has it), at each thread count, and what module timing costs on each
(TimedModule on torch, PERF_COUNT counters on OpenVINO).

    python benchmarks/bench_backends.py                       # 640 rect, 1 thread
    python benchmarks/bench_backends.py --square --forwards 20 --rounds 5

One thread by default, as each pipeline inference process runs: with more, torch's OpenMP pool
and OpenVINO's TBB pool share one process and spin against each other (torch at 2 threads read
10x slower here beside OpenVINO), which no pipeline process does.

Every variant is built once; rounds run every variant ``--forwards`` times in a rotating order,
so drift hits all alike. Reported: the median over rounds of ms per forward, and ratios of
medians of per-round ratios. CPU flags are printed with the figures: they decide bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402

from interleave import rotated  # noqa: E402  (benchmarks/: this script's folder)
from model_rates import letterboxed_input  # noqa: E402
from yolo.checkpoint import load_model  # noqa: E402
from yolo.precision import has_native_bf16, read_cpu_flags  # noqa: E402
from yolo.tensors import to_tensor  # noqa: E402
from yolo.timing import instrument  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(REPO_ROOT), "shared", "fixtures")
QUOTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_weights = os.path.join(FIXTURES, "yolov5n.pt")
    p.add_argument("--weights", default=default_weights if os.path.isfile(default_weights) else None)
    p.add_argument("--images", nargs="*", default=[os.path.join(FIXTURES, "bus.jpg")])
    p.add_argument("--imgsz", type=int, default=640)
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--rect", dest="rect", action="store_true", default=True)
    shape.add_argument("--square", dest="rect", action="store_false")
    p.add_argument("--threads", default="1", help="thread counts, e.g. 1,2 (see above before using more than 1)")
    p.add_argument("--forwards", type=int, default=10, help="timed forwards per variant and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out")
    a = p.parse_args(argv)
    a.threads = [int(t) for t in a.threads.split(",")]
    a.images = [i for i in a.images if os.path.isfile(i)]
    return a


def variants(a: argparse.Namespace, bf16: bool) -> dict[tuple, object]:
    """(backend, precision, timed) -> a model called as model(x); threads are set per call."""
    from backends.openvino import OpenVinoModel
    out = {}
    for precision in ("fp32", "bf16") if bf16 else ("fp32",):
        for timed in (False, True):
            model = load_model(a.weights, precision=precision)
            if timed:
                instrument(model, depth=2)
            out[("torch", precision, timed)] = model
            for threads in a.threads:
                out[("openvino", precision, timed, threads)] = OpenVinoModel(
                    a.weights, precision=precision, threads=threads, timing="layers" if timed else "none")
    return out


def measure(a: argparse.Namespace) -> dict:
    bf16 = has_native_bf16(read_cpu_flags())
    models = variants(a, bf16)
    x = to_tensor(letterboxed_input(argparse.Namespace(images=a.images, imgsz=a.imgsz, rect=a.rect)), "cpu")
    runs = [(key, threads) for key in models for threads in a.threads if key[0] == "torch" or key[3] == threads]
    samples: dict[tuple, list[float]] = {run: [] for run in runs}
    with torch.inference_mode():
        for run in runs:  # untimed: oneDNN and OpenVINO set up each shape on the first call
            torch.set_num_threads(run[1])
            models[run[0]](x)
        for r in range(a.rounds):
            for run in rotated(runs, r):
                torch.set_num_threads(run[1])
                t0 = time.perf_counter()
                for _ in range(a.forwards):
                    models[run[0]](x)
                samples[run].append((time.perf_counter() - t0) * 1e3 / a.forwards)
    rows = [{"backend": key[0], "precision": key[1], "module_timing": "layers" if key[2] else "none",
             "threads": threads, "ms_per_forward": statistics.median(ms), "ms_per_round": ms}
            for (key, threads), ms in samples.items()]
    return {"input_hw": list(x.shape[2:]), "cpu_flags": [f for f in QUOTED_FLAGS if f in read_cpu_flags()],
            "torch": torch.__version__, "openvino": __import__("openvino").__version__.split("-")[0],
            "forwards_per_round": a.forwards, "rounds": a.rounds, "rows": rows,
            "ratios": ratios(rows)}


def ratios(rows: list[dict]) -> dict[str, float]:
    """Medians of per-round ratios: openvino / torch (same precision, threads, no timing), and
    timed / untimed for each backend."""
    def find(backend, precision, timing, threads):
        return next((r for r in rows if (r["backend"], r["precision"], r["module_timing"], r["threads"]) ==
                     (backend, precision, timing, threads)), None)
    out = {}
    for r in rows:
        if r["module_timing"] != "none":
            continue
        key = (r["precision"], r["threads"])
        torch_row, timed = find("torch", *key[:1], "none", key[1]), find(r["backend"], key[0], "layers", key[1])
        if r["backend"] == "openvino" and torch_row:
            out[f"openvino/torch {key[0]} {key[1]}t"] = _paired(r, torch_row)
        if timed:
            out[f"{r['backend']} {key[0]} {key[1]}t timed/untimed"] = _paired(timed, r)
    return out


def _paired(a: dict, b: dict) -> float:
    return statistics.median(x / y for x, y in zip(a["ms_per_round"], b["ms_per_round"]))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    result = measure(a)
    h, w = result["input_hw"]
    print(f"one forward, {h}x{w}, torch {result['torch']}, OpenVINO {result['openvino']}, CPU flags "
          f"{' '.join(result['cpu_flags'])}, load average {os.getloadavg()[0]:.2f}; median of {a.rounds} rounds "
          f"of {a.forwards} forwards")
    print(f"{'backend':>9} {'precision':>9} {'timing':>7} {'threads':>7} {'ms/forward':>11}")
    for r in result["rows"]:
        print(f"{r['backend']:>9} {r['precision']:>9} {r['module_timing']:>7} {r['threads']:>7} "
              f"{r['ms_per_forward']:>11.1f}")
    for key, value in result["ratios"].items():
        print(f"  {key:40s} {value:.3f}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
