"""OpenVINO's thread pinning with several inference processes: two (or --processes) processes,
each one OpenVINO thread as the pipeline's inference workers run, forwarding at once, pinned
(OpenVINO's default, ENABLE_CPU_PINNING) against unpinned, interleaved round by round.

    python benchmarks/bench_pinning.py --rounds 4 --out pinning.json

Each process pins its own threads without knowing the others: when they all pick the same
core, each gets a share of it while the others idle. The figure that shows it is each
process's CPU time over its wall time (about 1 / processes when they share one core).
Writes every figure as JSON with --out."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline_print import machine  # noqa: E402  (benchmarks/: this script's folder)

WARM_FORWARDS = 3


def forward_loop(xml: str, shape: list[int], pin: bool, forwards: int, start, results) -> None:
    """One inference process: compile at ``shape`` with one thread, warm up, wait for the
    others, then time ``forwards`` forwards (wall and this process's CPU)."""
    import numpy as np
    import openvino as ov
    core = ov.Core()
    model = core.read_model(xml)
    model.reshape({0: shape})
    config = {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32", "ENABLE_CPU_PINNING": pin}
    request = core.compile_model(model, "CPU", config).create_infer_request()
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    for _ in range(WARM_FORWARDS):
        request.infer({0: x})
    start.wait()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(forwards):
        request.infer({0: x})
    results.put((time.perf_counter() - wall0, time.process_time() - cpu0))


def one_trial(xml: str, shape: list[int], pin: bool, processes: int, forwards: int) -> dict:
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=forward_loop, args=(xml, shape, pin, forwards, start, results))
               for _ in range(processes)]
    for w in workers:
        w.start()
    timed = [results.get() for _ in workers]
    for w in workers:
        w.join()
    wall = max(t[0] for t in timed)
    return {"fps": processes * forwards / wall, "cpu_per_wall": [cpu / w for w, cpu in timed]}


def main(argv: list[str] | None = None) -> int:
    from backends.openvino import converted_model_path
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", default=None, help="checkpoint (default: a random yolov5n)")
    p.add_argument("--shape", default="1,3,480,640", help="input N,C,H,W")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--forwards", type=int, default=20)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out")
    args = p.parse_args(argv)
    xml, _ = converted_model_path(args.weights)
    shape = [int(v) for v in args.shape.split(",")]
    trials: dict[str, list[dict]] = {"pinned": [], "unpinned": []}
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for pin in order:
            trial = one_trial(str(xml), shape, pin, args.processes, args.forwards)
            trials["pinned" if pin else "unpinned"].append(trial)
            print(f"round {r + 1} {'pinned' if pin else 'unpinned':8s} {trial['fps']:6.1f} fps; CPU / wall per process "
                  + " ".join(f"{v:.2f}" for v in trial["cpu_per_wall"]), flush=True)
    medians = {k: statistics.median(t["fps"] for t in v) for k, v in trials.items()}
    ratios = [u["fps"] / p_["fps"] for p_, u in zip(trials["pinned"], trials["unpinned"])]
    print(f"median fps: pinned {medians['pinned']:.1f}, unpinned {medians['unpinned']:.1f}; unpinned / pinned, "
          f"median of per-round ratios: {statistics.median(ratios):.2f}x ({machine()['cpu']}, "
          f"{' '.join(machine()['cpu_flags'])}; load average {os.getloadavg()[0]:.2f})")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"command": " ".join(["python", "benchmarks/bench_pinning.py", *(argv or sys.argv[1:])]),
                       "settings": vars(args), "machine": machine(), "trials": trials, "median_fps": medians,
                       "unpinned_over_pinned": statistics.median(ratios), "load_average_end": os.getloadavg()},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
