"""One node against two simulated Ray nodes on this machine, and what Ray itself costs.

    python benchmarks/bench_cluster.py --frames 200 --rounds 2

Each round runs `runner.py --ray` on a 1-node cluster (all cores) and on a 2-node cluster (half
the cores each), in rotating order (benchmarks/interleave.py), and prints the merged fps, the
wall time and each node's runner start. It also prints the cluster's start seconds and the PSS
of Ray's own processes, idle. No gain is expected: two simulated nodes share this machine's cores,
so they split the same CPU the single node had and add a second set of processes; a real second
host adds its own cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.interleave import rotated  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RAY_MARKS = ("raylet", "gcs_server", "ray::", "ray/dashboard", "default_worker", "log_monitor", "plasma")


def start_cluster(node_cpus: list[int]):
    from ray.cluster_utils import Cluster
    started = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for cpus in node_cpus:
        cluster.add_node(num_cpus=cpus)
    cluster.wait_for_nodes()
    return cluster, time.perf_counter() - started


def ray_pss_mib() -> float:
    """PSS of this machine's Ray processes (every cluster the benchmark started is one of them)."""
    total = 0
    for process in psutil.process_iter(["pid"]):
        try:
            if any(mark in " ".join(process.cmdline()) for mark in RAY_MARKS):
                total += process.memory_full_info().pss
        except (psutil.Error, OSError):
            continue
    return total / 2**20


def run_once(address: str, frames: int, flags: list[str]) -> dict:
    results = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    try:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, str(REPO / "runner.py"), "--ray", address, "--results", str(results),
                               "--synthetic-count", str(frames), "--json", "--no-progress", *flags],
                              cwd=REPO, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        report = json.loads((results / "latest" / "report.json").read_text())
        starts = [row["runner_start_s"] for row in report["cluster"]["nodes"] if row["runner_start_s"]]
        return {"exit_code": done.returncode, "fps": report["throughput"]["fps"], "wall_s": wall,
                "runner_start_s": sum(starts) / len(starts) if starts else None,
                "frames": {row["node"]: row["processed"] for row in report["cluster"]["nodes"]}}
    finally:
        shutil.rmtree(results, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lead-s", type=float, default=1.0)
    parser.add_argument("runner_flags", nargs="*", help="more runner flags, after --")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    idle = ray_pss_mib()
    layouts = {"1 node": [cores], "2 nodes": [max(cores // 2, 1)] * 2}
    clusters = {}
    for name, cpus in layouts.items():
        clusters[name], start_s = start_cluster(cpus)
        print(f"{name}: cluster start {start_s:.1f} s; Ray processes now {ray_pss_mib() - idle:.0f} MiB PSS "
              "(all clusters so far, idle)", flush=True)
    flags = ["--ray-lead-s", str(args.lead_s), *args.runner_flags]
    try:
        for r in range(args.rounds):
            for name in rotated(list(layouts), r):
                result = run_once(clusters[name].address, args.frames, flags)
                print(f"round {r} {name}: {json.dumps(result)}", flush=True)
    finally:
        for cluster in clusters.values():
            cluster.shutdown()


if __name__ == "__main__":
    main()
