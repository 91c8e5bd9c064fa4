"""A frame's cost outside the model: CPU-ms per frame per role of the model-free pipeline, and the
rate a collector alone sustains.

``pipeline``: ``runner.py --preset none`` (no model: inference answers at once) over the same real
frames (the fixtures bus.jpg and zidane.jpg re-encoded at 0.6x to 1.75x, 48 JPEGs), with images
saved and without, in interleaved rounds; per role (pre, infer, post, collector, runner, other)
the CPU-ms per frame from every process's own CPU clock over the measured window (the report's
resource samples), medians over the rounds.

``collector``: one collector process fed by a synthetic producer at full speed (results as the
last frame stage sends them: batches of 64, five detections each, records as JSON text), then
every worker's summary: the fps it took them at (wall, beside the producer on these 2 vCPUs),
and its CPU-ms per frame while it did (its own CPU clock, every thread). With ``--paced``, fed
one-frame messages at fixed rates instead (0: idle): its CPU-ms per second and per message,
where its fixed costs (wake-ups, progress, resource samples) show.

Usage: ``python benchmarks/bench_overhead.py pipeline [--rounds 3] [--frames 480] [--repos A B] [--json OUT]``
(``--repos``: checkouts to compare in the same rounds, e.g. a worktree of the commit before a change)
       ``python benchmarks/bench_overhead.py collector [--frames 30000] [--rounds 3]``
       ``python benchmarks/bench_overhead.py collector --paced 0 50 100 200 [--seconds 10] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

FIXTURES = REPO_ROOT.parent / "shared" / "fixtures"
SCALES = (0.6, 0.75, 0.9, 1.0, 1.1, 1.25, 1.4, 1.5, 1.6, 1.75, 0.8, 1.2)
ROLES = ("pre", "infer", "post", "collector", "runner", "other")
DETECTIONS_PER_FRAME = 5


# -- the model-free pipeline --------------------------------------------------------------------------
def make_frames(folder: Path, copies: int = 2) -> int:
    """The fixtures re-encoded at SCALES (JPEG quality 95), ``copies`` of each: 48 files."""
    import cv2
    count = 0
    for fixture in ("bus.jpg", "zidane.jpg"):
        image = cv2.imread(str(FIXTURES / fixture))
        for scale in SCALES:
            resized = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
            for copy in range(copies):
                cv2.imwrite(str(folder / f"{Path(fixture).stem}_{scale:.2f}_{copy}.jpg"), resized,
                            [cv2.IMWRITE_JPEG_QUALITY, 95])
                count += 1
    return count


def cpu_ms_by_role(report: dict) -> dict[str, float]:
    """CPU-ms per frame completed in the measured window, per role, from the resource samples."""
    cpu = report["cpu"]
    completed = 1e3 * cpu["window_cpu_s"] / cpu["cpu_ms_per_frame"]
    by_role = dict.fromkeys(ROLES, 0.0)
    for name, process in report["resources"]["processes"].items():
        role = process["role"] if process["role"] in ROLES else "other"
        by_role[role] += 1e3 * (process.get("window_cpu_s") or 0.0) / completed
    by_role["total"] = cpu["cpu_ms_per_frame"]
    return by_role


def run_pipeline(repo: Path, source: Path, results: Path, name: str, frames: int, save: str, extra: list[str]) -> dict:
    command = [sys.executable, str(repo / "runner.py"), "--preset", "none", "--source", str(source),
               "--frames", str(frames), "--warmup", "48", "--save-images", save, "--results", str(results),
               "--name", name, "--exist-ok", "--no-progress", "--log-level", "warning", *extra]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=repo)  # its own packages, not the caller's
    report = json.loads((results / name / "report.json").read_text())
    return {"fps": report["throughput"]["fps"], "by_role": cpu_ms_by_role(report)}


def pipeline(args) -> dict:
    """Each round runs every case (images saved, not) on every checkout, in an order that
    alternates round by round; medians per checkout and case."""
    repos = [Path(r).resolve() for r in args.repos] or [REPO_ROOT]
    cases = [(repo, save) for repo in repos for save in ("saved", "none")]
    runs: dict[tuple, list[dict]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        source, results = Path(tmp) / "frames", Path(tmp) / "results"
        source.mkdir()
        print(f"{make_frames(source)} frames of 0.6-1.75x bus.jpg and zidane.jpg in {source}")
        for round_index in range(args.rounds):
            for repo, save in cases if round_index % 2 == 0 else cases[::-1]:
                run = run_pipeline(repo, source, results, save, args.frames, "all" if save == "saved" else "none",
                                   args.runner_args)
                runs[repo, save].append(run)
                print(f"round {round_index + 1} {repo.name} images {save:5s}: {run['fps']:7.1f} fps  " +
                      "  ".join(f"{role} {run['by_role'][role]:.2f}" for role in (*ROLES, "total")), flush=True)
    summary = {f"{repo.name}/{save}": {"fps": statistics.median(r["fps"] for r in rs),
                                       "cpu_ms": {role: statistics.median(r["by_role"][role] for r in rs)
                                                  for role in (*ROLES, "total")}}
               for (repo, save), rs in runs.items()}
    print("\nmedians, CPU-ms per frame by role")
    print(f"  {'':22s}" + "".join(f"{role:>10s}" for role in (*ROLES, "total")) + "       fps")
    for key, s in summary.items():
        print(f"  {key:22s}" + "".join(f"{s['cpu_ms'][role]:10.3f}" for role in (*ROLES, "total"))
              + f"{s['fps']:10.1f}  collector+runner {s['cpu_ms']['collector'] + s['cpu_ms']['runner']:.3f}"
              + f" (CPU-ms a second: collector {s['cpu_ms']['collector'] * s['fps']:.1f},"
              + f" runner {s['cpu_ms']['runner'] * s['fps']:.1f})")
    return {"pipeline": summary, "runs": {f"{repo.name}/{save}": rs for (repo, save), rs in runs.items()}}


# -- a collector alone ---------------------------------------------------------------------------------
def collector(args) -> dict:
    if args.paced is not None:
        return paced(args)
    rounds = [collector_round(args.frames) for _ in range(args.rounds)]
    for r in rounds:
        print(f"collector alone: {r['frames']} frames at {r['fps']:.0f} fps, {r['cpu_ms_per_frame']:.4f} CPU-ms a frame "
              f"({r['capacity_fps']:.0f} fps at one core)")
    summary = {key: statistics.median(r[key] for r in rounds) for key in ("fps", "cpu_ms_per_frame", "capacity_fps")}
    print(f"median: {summary['fps']:.0f} fps, {summary['cpu_ms_per_frame']:.4f} CPU-ms a frame, "
          f"capacity {summary['capacity_fps']:.0f} fps")
    return {"collector": summary, "rounds": rounds}


def collector_round(frames: int) -> dict:
    from wire.messages import PROGRESS
    from wire.transport import recv_message
    with CollectorUnderTest(frames) as under_test:
        cpu0, t0 = under_test.cpu_s(), time.perf_counter()
        under_test.producer.send_results(frames)
        taken = 0
        while taken < frames:
            header = recv_message(under_test.progress, token=under_test.token).header
            if header["type"] == PROGRESS:
                taken = header["processed"]
        cpu1, t1 = under_test.cpu_s(), time.perf_counter()
    cpu_ms = 1e3 * (cpu1 - cpu0) / frames
    return {"frames": frames, "fps": frames / (t1 - t0), "cpu_ms_per_frame": cpu_ms, "capacity_fps": 1e3 / cpu_ms}


def paced(args) -> dict:
    """A collector fed one-frame results at each rate of ``--paced`` (0: idle, only its own
    loop), ``--seconds`` each: its CPU-ms per second and per message, medians over the rounds.
    What it spends per second at a low rate is its fixed cost (wake-ups, progress, samples)."""
    by_rate: dict[float, list[dict]] = {rate: [] for rate in args.paced}
    for round_index in range(args.rounds):
        for rate in args.paced if round_index % 2 == 0 else args.paced[::-1]:
            run = paced_round(rate, args.seconds)
            by_rate[rate].append(run)
            print(f"round {round_index + 1} paced {rate:6.0f} msg/s: {run['cpu_ms_per_s']:6.2f} CPU-ms/s, "
                  f"{run['cpu_ms_per_message']:.3f} CPU-ms a message", flush=True)
    summary = {f"{rate:g}": {key: statistics.median(r[key] for r in runs) for key in ("cpu_ms_per_s", "cpu_ms_per_message")}
               for rate, runs in by_rate.items()}
    for rate, s in summary.items():
        print(f"median at {rate:>6s} msg/s: {s['cpu_ms_per_s']:6.2f} CPU-ms/s, {s['cpu_ms_per_message']:.3f} CPU-ms a message")
    return {"paced": summary, "rounds": {f"{rate:g}": runs for rate, runs in by_rate.items()}}


def paced_round(rate: float, seconds: float) -> dict:
    """One-frame Results messages at ``rate`` a second for ``seconds`` (sent on a schedule, so
    a late one does not shift the rest): the collector's CPU over that time."""
    count = int(rate * seconds)
    with CollectorUnderTest(max(count, 1)) as under_test:
        cpu0, t0 = under_test.cpu_s(), time.perf_counter()
        for i in range(count):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            under_test.producer.send_results(1, start=i)
        time.sleep(max(0.0, t0 + seconds - time.perf_counter()))
        cpu1, t1 = under_test.cpu_s(), time.perf_counter()
    cpu_ms = 1e3 * (cpu1 - cpu0)
    return {"rate": rate, "messages": count, "cpu_ms_per_s": cpu_ms / (t1 - t0),
            "cpu_ms_per_message": cpu_ms / count if count else float("nan")}


class CollectorUnderTest:
    """A collector process as the runner starts it (its progress socket read here, its results
    sent by a SyntheticProducer); on leaving, every worker's summary, and the run folder written."""

    WORKERS = ("pre-0", "infer-0", "post-0")

    def __init__(self, frames: int):
        self.frames = frames

    def __enter__(self):
        import multiprocessing as mp
        import secrets

        import psutil
        import zmq

        from inputs.sources import plan_frames
        from settings.config import RunConfig
        from supervisor.processes import run_stage
        from wire.transport import make_socket
        from wire.wiring import StageArgs, Wire, make_endpoints
        from yolo.names import COCO_NAMES

        self.tmp = tempfile.TemporaryDirectory(prefix="bench-coll-", dir="/tmp")
        tmp, frames = self.tmp.name, self.frames
        cfg = RunConfig(save_images="none", synthetic_count=frames)
        endpoints = make_endpoints("ipc", tmp, "", 0, {"pre": 1, "infer": 1, "post": 1, "collector": 1})
        wire = Wire(secrets.token_bytes(16))
        self.token = wire.token
        run_dir = os.path.join(tmp, "run")
        os.mkdir(run_dir)
        args = StageArgs(name="collector", index=0, config=cfg, plan=plan_frames("synthetic", synthetic_count=frames),
                         endpoints=endpoints, wire=wire, log_path=os.path.join(run_dir, "run.log"), run_dir=run_dir,
                         run_tag=f"bench-{os.getpid()}", names=tuple(COCO_NAMES), runner_pid=os.getpid(),
                         workers=self.WORKERS)
        self.ctx = zmq.Context()
        self.progress = make_socket(self.ctx, zmq.PULL)
        self.progress.bind(endpoints["progress"])
        self.process = mp.get_context("spawn").Process(target=run_stage, args=("collector.collector", args),
                                                       daemon=True)
        self.process.start()
        self.producer = SyntheticProducer(self.ctx, endpoints["collector"], wire.token, self.WORKERS)
        self.watched = psutil.Process(self.process.pid)
        time.sleep(1.0)  # the collector binds and settles
        return self

    def cpu_s(self) -> float:
        """The collector's CPU clock, every thread."""
        return sum(self.watched.cpu_times()[:2])

    def __exit__(self, *exc) -> None:
        from wire.messages import FINISHED
        from wire.transport import recv_message
        self.producer.send_summaries()
        while recv_message(self.progress, token=self.token).header["type"] != FINISHED:
            pass
        self.process.join(30)
        self.producer.close()
        self.progress.close()
        self.ctx.term()
        self.tmp.cleanup()


class SyntheticProducer:
    """Sends what the last frame stage sends the collector, as fast as it can."""

    def __init__(self, ctx, endpoint: str, token: bytes, workers: tuple[str, ...]):
        import zmq

        from wire.transport import make_socket
        self.socket = make_socket(ctx, zmq.PUSH, sndhwm=100_000)
        self.socket.connect(endpoint)
        self.token, self.workers = token, workers

    def result(self, frame_id: int) -> dict:
        from wire.messages import Result
        now = time.perf_counter()
        records = [{"image": f"synthetic/{frame_id}.jpg", "frame": frame_id, "class_id": k, "class": "person",
                    "score": 0.5, "box": [10.0 * k, 20.0, 30.0 + k, 40.0]} for k in range(DETECTIONS_PER_FRAME)]
        predictions = [{"image_id": frame_id, "category_id": 1, "bbox": [10.0 * k, 20.0, 20.0, 20.0], "score": 0.5}
                       for k in range(DETECTIONS_PER_FRAME)]
        stamps = dict.fromkeys(("read_start", "read_end", "pre_end", "infer_recv", "infer_start", "infer_end",
                                "post_start", "post_end"), now)
        return Result(id=frame_id, name=f"synthetic/{frame_id}.jpg", t=stamps, detections=records,
                      workers=dict(zip(("pre", "infer", "post"), self.workers)), batch=1, image_saved=False,
                      cold=False, predictions=predictions).to_message()

    def send_results(self, frames: int, start: int = 0) -> None:
        """Frames ``start`` to ``start + frames`` in Results batches of RESULTS_BATCH frames, as the
        last stage sends them at full speed (its records written as JSON text there)."""
        from wire.messages import Results, done_item
        from wire.transport import send_message
        from workers.onward import RESULTS_BATCH
        for first in range(start, start + frames, RESULTS_BATCH):
            items = [done_item(self.result(i)) for i in range(first, min(start + frames, first + RESULTS_BATCH))]
            send_message(self.socket, Results(items).to_message(), token=self.token)

    def send_summaries(self) -> None:
        from analysis.samples import Samples
        from wire.messages import Stats
        from wire.transport import send_message
        for name in self.workers:
            none = Samples().to_dict()
            stats = Stats(name=name, role=name.split("-")[0], incarnation=0, pid=os.getpid(), frames=0, wall_s=1.0,
                          busy_s=0.0, busy_cpu_s=0.0, cpu_s=0.0, wait_in_s=0.0, blocked_out_s=0.0, frame_ms=none,
                          frame_cpu_ms=none, substages_ms={}, extra={"position": 10**9} if name == "pre-0" else {})
            send_message(self.socket, stats.to_message(), token=self.token)

    def close(self) -> None:
        self.socket.close(linger=1000)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    pipe = sub.add_parser("pipeline", help="the model-free pipeline, images saved and not")
    pipe.add_argument("--rounds", type=int, default=3)
    pipe.add_argument("--frames", type=int, default=480)
    pipe.add_argument("--repos", nargs="*", default=[], help="checkouts to compare, interleaved (default: this one)")
    pipe.add_argument("runner_args", nargs="*", help="more runner flags, after --")
    coll = sub.add_parser("collector", help="a collector alone, fed at full speed")
    coll.add_argument("--frames", type=int, default=30_000)
    coll.add_argument("--rounds", type=int, default=3)
    coll.add_argument("--paced", type=float, nargs="+", metavar="RATE",
                      help="instead: one-frame messages at each RATE a second (0: idle), interleaved")
    coll.add_argument("--seconds", type=float, default=10.0, help="with --paced: how long each rate runs")
    for parser in (pipe, coll):
        parser.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    figures = pipeline(args) if args.what == "pipeline" else collector(args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
