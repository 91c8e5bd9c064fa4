"""Issue 32's first goal, measured: namespaced Ray nodes, frames from an S3-compatible store,
results to it.

    python benchmarks/bench_cluster_store.py --frames 2000 --imgsz 320 --nodes 3
    python benchmarks/bench_cluster_store.py --frames 200            # a dry run

Needs root, iproute2 and util-linux (tests/netns_cluster.py: one network namespace per node on a
test bridge, its own /tmp and /dev/shm), Ray and moto's server (requirements-ray.txt,
requirements-dev.txt) and the fixtures (../shared/fixtures: yolov5n.pt, bus.jpg, zidane.jpg).

What it does:
- starts moto's S3 server on the bridge's host address (tests/store_server.py) and puts FRAMES
  images in ``s3://frames/imgs``: bus.jpg and zidane.jpg re-encoded at 11 scales (0.5x-1.5x), each
  under its own name (``0000-bus-0.50.jpg``, ...);
- starts NODES namespaced Ray nodes (1 CPU each) and, on the head, three runs of the real yolov5n
  (``--imgsz IMGSZ``), each reading every frame from the store and writing its outputs to
  ``s3://frames/runs/NAME`` (with ``--ray`` each node PUTs its own; the driver uploads the merged
  reports):
    ``cluster``      ``runner.py --ray HEAD --save-images all``  (FRAMES images saved)
    ``cluster-10``   ``runner.py --ray HEAD --save-images 10``   (about FRAMES / 10 saved)
    ``single``       ``runner.py --save-images all``, no Ray, on the head's namespace
  each driver under ``/usr/bin/time -f %M`` (its peak RSS; its process tree's summed RSS is also
  polled every 0.5 s);
- checks and prints: every frame once (report.json: processed == FRAMES, failed and lost 0,
  processed_twice 0, processed_ids one range; detections.json: no image's records from two
  frames), the detections of ``cluster`` equal those of ``single`` (per image: the same classes,
  boxes within 1 px, scores within 0.01; the largest differences printed), one annotated image
  per frame in the store under the source's names, the driver's peak RSS of ``cluster`` against
  ``cluster-10`` (goal: within 10 %), the node table's fps per node and the single run's fps.

The nodes, the driver, moto's server and this script share this machine's cores: the fps are
not a per-node speed of separate hosts (the 0.95x-per-node goal cannot be judged here).
Everything (namespaces, bridge, their folders, the server) is removed at the end, also on a
failure, Ctrl-C or SIGTERM; every run has a timeout (``--run-timeout-s``). Exit 0 when every
goal held, 1 when one did not, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_with_cleanup import in_child, on_sigterm, run_in_child  # noqa: E402  (benchmarks/: this script's folder)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BUCKET = "frames"  # tests/store_server.py's
SOURCE = f"s3://{BUCKET}/imgs"
RESULTS = f"s3://{BUCKET}/runs"
SCALES = [round(0.5 + 0.1 * i, 2) for i in range(11)]  # 0.5x ... 1.5x
BASES = ("bus.jpg", "zidane.jpg")
BOX_TOLERANCE_PX = 1.0
SCORE_TOLERANCE = 0.01
MEMORY_GOAL = 0.10


def images(frames: int, fixtures: Path) -> dict[str, bytes]:
    """``frames`` JPEGs under distinct keys: the fixtures at SCALES in turn (22 distinct pictures)."""
    import cv2
    encoded = {}
    for base in BASES:
        picture = cv2.imread(str(fixtures / base))
        if picture is None:
            raise SystemExit(f"error: {fixtures / base} not found or not an image")
        for scale in SCALES:
            size = (round(picture.shape[1] * scale), round(picture.shape[0] * scale))
            ok, data = cv2.imencode(".jpg", cv2.resize(picture, size, interpolation=cv2.INTER_AREA),
                                    [cv2.IMWRITE_JPEG_QUALITY, 90])
            assert ok
            encoded[(base, scale)] = data.tobytes()
    out = {}
    for i in range(frames):
        base, scale = BASES[i % 2], SCALES[(i // 2) % len(SCALES)]
        out[f"{i:04d}-{base.removesuffix('.jpg')}-{scale:.2f}.jpg"] = encoded[(base, scale)]
    return out


def store_fs():
    import fsspec
    return fsspec.filesystem("s3", skip_instance_cache=True)


def upload(objects: dict[str, bytes]) -> float:
    """Make the bucket and put ``imgs/<name>`` for each object (s3fs's concurrent PUTs); seconds."""
    started = time.monotonic()
    fs = store_fs()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    fs.pipe({f"{BUCKET}/imgs/{name}": data for name, data in objects.items()})
    return time.monotonic() - started


class TreePeak(threading.Thread):
    """The peak of the summed RSS of a process and its descendants, polled every 0.5 s."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stopped = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                root = psutil.Process(self.pid)
                rss = 0
                for process in [root, *root.children(recursive=True)]:
                    try:
                        if process.name() not in ("nsenter", "time"):
                            rss += process.memory_info().rss
                    except psutil.Error:
                        continue
                self.peak = max(self.peak, rss)
            except psutil.Error:
                return


def run_driver(made, env: dict, name: str, flags: list[str], ray: bool, timeout_s: float) -> dict:
    """One runner.py on the head (its network, /tmp, PIDs) under /usr/bin/time; its exit code,
    wall seconds, peak RSS (time's %M, and the polled tree) and report.json from the store."""
    rss_file = f"/tmp/maxrss-{name}"  # the head's /tmp
    command = ["/usr/bin/time", "-f", "%M", "-o", rss_file, sys.executable, str(REPO / "runner.py"),
               *(["--ray", made.address] if ray else []), "--source", SOURCE, "--results", RESULTS,
               "--name", name, "--json", "--no-progress", *flags]
    log = made.root / f"driver-{name}.log"
    print(f"[{name}] {' '.join(command[5:])}", flush=True)
    started = time.monotonic()
    with open(log, "wb") as err:
        proc = made.start_on(0, command, env, wd=str(REPO), stdout=subprocess.PIPE, stderr=err)
    poll = TreePeak(proc.pid)
    poll.start()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        raise RuntimeError(f"[{name}] did not finish in {timeout_s:.0f} s:\n"
                           + log.read_text(errors="replace")[-3000:]) from None
    finally:
        poll.stopped.set()
    wall = time.monotonic() - started
    rss_path = made.nodes[0].root / rss_file.removeprefix("/tmp/")
    lines = rss_path.read_text().split() if rss_path.is_file() else []
    maxrss_kib = int(lines[-1]) if lines and lines[-1].isdigit() else None
    fs = store_fs()
    report_key = f"{RESULTS.removeprefix('s3://')}/{name}/report.json"
    report = json.loads(fs.cat_file(report_key)) if fs.exists(report_key) else {}
    result = {"name": name, "exit_code": proc.returncode, "wall_s": wall, "maxrss_kib": maxrss_kib,
              "tree_peak_rss_kib": poll.peak // 1024, "report": report, "log": log}
    print(f"[{name}] exit {proc.returncode} in {wall:.1f} s, driver peak RSS {maxrss_kib} KiB "
          f"(polled tree {poll.peak // 1024} KiB)", flush=True)
    if proc.returncode != 0 or not report:
        print(log.read_text(errors="replace")[-3000:], flush=True)
    return result


def stored_names(name: str, folder: str) -> list[str]:
    prefix = f"{RESULTS.removeprefix('s3://')}/{name}/{folder}/"
    fs = store_fs()
    return sorted(path.removeprefix(prefix) for path in fs.find(prefix)) if fs.exists(prefix) else []


def detections(name: str) -> list[dict]:
    key = f"{RESULTS.removeprefix('s3://')}/{name}/detections.json"
    fs = store_fs()
    return json.loads(fs.cat_file(key)) if fs.exists(key) else []


def frame_checks(result: dict, frames: int, names: list[str], saved_expected: int | None) -> dict:
    """Every frame once: the ledger, the detection records' frames per image, the stored images."""
    report = result["report"]
    f = report.get("frames", {})
    records = detections(result["name"])
    frames_of = defaultdict(set)
    for record in records:
        frames_of[record["image"]].add(record["frame"])
    stored = stored_names(result["name"], "images")
    checks = {
        "exit 0": result["exit_code"] == 0,
        f"processed == {frames}": f.get("processed") == frames,
        "failed, lost 0": f.get("failed") == 0 and f.get("lost") == 0,
        "processed_twice 0": f.get("processed_twice", 0) == 0,
        "processed_ids one range": f.get("processed_ids") in (None, [[0, frames - 1]]),
        "no image's records from two frames": all(len(ids) == 1 for ids in frames_of.values()),
        "records only of source images": set(frames_of) <= set(names),
    }
    if saved_expected is not None:
        checks[f"{saved_expected} annotated images, the source's names"] = stored == names
    figures = {"processed": f.get("processed"), "failed": f.get("failed"), "lost": f.get("lost"),
               "cancelled": f.get("cancelled"), "processed_twice": f.get("processed_twice"),
               "processed_ids": f.get("processed_ids"), "records": len(records),
               "images_with_records": len(frames_of), "images_stored": len(stored),
               "labels_stored": len(stored_names(result["name"], "labels")),
               "streamed_bytes": report.get("outputs", {}).get("streamed_bytes")}
    return {"checks": checks, "figures": figures, "records": records, "stored": stored}


def compare(cluster: list[dict], single: list[dict]) -> dict:
    """Per image, records matched in order of (class, box): counts, classes, largest box and score
    differences; the images that differ beyond the tolerances."""
    by_image = {"cluster": defaultdict(list), "single": defaultdict(list)}
    for label, records in (("cluster", cluster), ("single", single)):
        for record in records:
            by_image[label][record["image"]].append(record)
    worst_box = worst_score = 0.0
    worst_box_at = worst_score_at = None
    differing = []
    for image in sorted(set(by_image["cluster"]) | set(by_image["single"])):
        a = sorted(by_image["cluster"][image], key=lambda r: (r["class_id"], r["box"]))
        b = sorted(by_image["single"][image], key=lambda r: (r["class_id"], r["box"]))
        if len(a) != len(b) or [r["class_id"] for r in a] != [r["class_id"] for r in b]:
            differing.append({"image": image, "cluster": len(a), "single": len(b),
                              "classes": [[r["class"] for r in a], [r["class"] for r in b]]})
            continue
        for ra, rb in zip(a, b):
            box = max(abs(x - y) for x, y in zip(ra["box"], rb["box"]))
            score = abs(ra["score"] - rb["score"])
            if box > worst_box:
                worst_box, worst_box_at = box, image
            if score > worst_score:
                worst_score, worst_score_at = score, image
            if box > BOX_TOLERANCE_PX or score > SCORE_TOLERANCE:
                differing.append({"image": image, "box_px": box, "score": score})
    return {"images_compared": len(set(by_image["cluster"]) | set(by_image["single"])),
            "records": [len(cluster), len(single)], "max_box_diff_px": worst_box, "at": worst_box_at,
            "max_score_diff": worst_score, "score_at": worst_score_at, "differing": differing,
            "equal": not differing and len(cluster) == len(single)}


def node_table(report: dict) -> list[dict]:
    keep = ("node", "host", "address", "cpus", "processed", "failed", "fps", "window_s", "cpu_ms_per_frame",
            "bottleneck", "runner_start_s", "status")
    return [{key: row.get(key) for key in keep} for row in report.get("cluster", {}).get("nodes", [])]


def show_checks(title: str, checks: dict) -> bool:
    print(f"{title}: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in checks.items()), flush=True)
    return all(checks.values())


def remove_leftovers() -> None:
    """What a benchmark child killed before its own clean-up left: the namespaces, bridge and
    folders, removed under the cluster lock, as the next cluster would (tests/netns_cluster.py)."""
    import glob
    import shutil
    import tempfile

    from tests import netns_cluster
    with netns_cluster._lock():  # no cluster lives while it is held: what is there is the child's
        netns_cluster.remove_namespaces()
        for stale in glob.glob(os.path.join(tempfile.gettempdir(), f"{netns_cluster.ROOT_PREFIX}*")):
            shutil.rmtree(stale, ignore_errors=True)
    print("its namespaces, bridge and folders removed here", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=2000, help="images in the store (default 2000)")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--save-every", type=int, default=10, help="--save-images of the memory comparison run")
    parser.add_argument("--run-timeout-s", type=float, default=0.0,
                        help="each runner.py's limit (default: 300 s + 1 s a frame)")
    parser.add_argument("--json-out", help="write every figure there as JSON")
    parser.add_argument("runner_flags", nargs="*", help="more runner flags for every run, after --")
    args = parser.parse_args()
    if not in_child():
        limit_s = 3 * (args.run_timeout_s or 300.0 + args.frames) + 900.0  # three runs, upload, nodes, checks
        return run_in_child(limit_s, remove_leftovers)

    from tests import netns_cluster
    from tests.conftest import FIXTURES_DIR
    from tests.store_server import s3_server

    reason = netns_cluster.why_not()
    if reason:
        print(f"error: namespaced nodes cannot be made here: {reason}", file=sys.stderr)
        return 2
    weights = FIXTURES_DIR / "yolov5n.pt"
    if not weights.is_file():
        print(f"error: {weights} not found", file=sys.stderr)
        return 2
    on_sigterm()
    timeout_s = args.run_timeout_s or 300.0 + args.frames
    flags = ["--weights", str(weights), "--imgsz", str(args.imgsz), *args.runner_flags]
    objects = images(args.frames, FIXTURES_DIR)
    names = sorted(objects)
    print(f"{args.frames} images, {sum(map(len, objects.values())) / 2**20:.0f} MiB "
          f"({len(set(map(bytes, objects.values())))} distinct pictures); runner flags {' '.join(flags)}", flush=True)
    out = {"frames": args.frames, "imgsz": args.imgsz, "nodes": args.nodes, "flags": flags}
    started = time.monotonic()
    with netns_cluster.netns_cluster() as made, s3_server(host=netns_cluster.HOST_IP) as (_endpoint, env):
        os.environ.update(env)  # this process reads and writes the store too
        out["upload_s"] = upload(objects)
        print(f"uploaded to {SOURCE} in {out['upload_s']:.1f} s", flush=True)
        out["cluster_start_s"] = made.start(args.nodes, env)
        on_sigterm()  # again, defensively: Ray's client code ran in this process meanwhile
        print(f"{args.nodes} namespaced nodes up in {out['cluster_start_s']:.1f} s", flush=True)
        runs = {
            "cluster": run_driver(made, env, "cluster", [*flags, "--save-images", "all"], True, timeout_s),
            "cluster-10": run_driver(made, env, "cluster-10", [*flags, "--save-images", str(args.save_every)],
                                     True, timeout_s),
        }
        # the single run goes on with the cluster up (Ray idle beside it), on the head's namespace
        runs["single"] = run_driver(made, env, "single", [*flags, "--save-images", "all"], False, timeout_s)

        ok = True
        checked = {}
        for name, result in runs.items():
            checked[name] = frame_checks(result, args.frames, names, args.frames if name != "cluster-10" else None)
            ok &= show_checks(f"[{name}] every frame once", checked[name]["checks"])
            print(f"[{name}] {json.dumps(checked[name]['figures'])}", flush=True)
        saved_10 = checked["cluster-10"]["figures"]["images_stored"]
        frame_of = {r["image"]: r["frame"] for r in checked["cluster-10"]["records"]}
        kept = sorted(frame_of[n] for n in checked["cluster-10"]["stored"] if n in frame_of)
        one_machine = sum(1 for i in kept if i % args.save_every == 0)
        print(f"[cluster-10] {saved_10} annotated images in the store ({args.frames // args.save_every} on one machine: "
              f"the frames whose global id is a multiple of {args.save_every}; {one_machine} of the {len(kept)} "
              f"saved frames with records are such frames)", flush=True)
        out["saved_10"] = {"stored": saved_10, "with_records": len(kept), "global_multiples": one_machine,
                           "first_ids": kept[:20]}

        same = compare(checked["cluster"]["records"], checked["single"]["records"])
        print(f"detections, cluster against single: {same['records'][0]} and {same['records'][1]} records over "
              f"{same['images_compared']} images; largest box difference {same['max_box_diff_px']:.4f} px "
              f"({same['at']}), largest score difference {same['max_score_diff']:.6f} ({same['score_at']}); "
              f"{len(same['differing'])} images differ beyond {BOX_TOLERANCE_PX} px / {SCORE_TOLERANCE}"
              + (f": {json.dumps(same['differing'][:5])}" if same["differing"] else ""), flush=True)
        ok &= same["equal"]

        rss_all, rss_10 = runs["cluster"]["maxrss_kib"], runs["cluster-10"]["maxrss_kib"]
        growth = rss_all / rss_10 - 1 if rss_all and rss_10 else None
        tree_all, tree_10 = runs["cluster"]["tree_peak_rss_kib"], runs["cluster-10"]["tree_peak_rss_kib"]
        print(f"driver peak RSS: {rss_all / 1024:.0f} MiB with {checked['cluster']['figures']['images_stored']} "
              f"images saved, {rss_10 / 1024:.0f} MiB with {saved_10}: {growth:+.1%} "
              f"(goal within {MEMORY_GOAL:.0%}: {'held' if growth is not None and abs(growth) <= MEMORY_GOAL else 'NOT held'}); "
              f"polled tree {tree_all / 1024:.0f} and {tree_10 / 1024:.0f} MiB", flush=True)
        ok &= growth is not None and abs(growth) <= MEMORY_GOAL

        for name in ("cluster", "cluster-10"):
            report = runs[name]["report"]
            rows = node_table(report)
            print(f"[{name}] fps {report.get('throughput', {}).get('fps')}, wall {runs[name]['wall_s']:.1f} s; "
                  "nodes: " + "; ".join(f"{r['host']} ({r['address']}) {r['processed']} frames at "
                                        f"{(r['fps'] or 0):.1f} fps, {r['status']}" for r in rows), flush=True)
        single = runs["single"]["report"].get("throughput", {})
        print(f"[single] fps {single.get('fps')}, wall {runs['single']['wall_s']:.1f} s (on this machine's "
              f"{len(os.sched_getaffinity(0))} CPUs, which the {args.nodes} nodes above shared too: "
              "the 0.95x-per-node goal cannot be judged here)", flush=True)

        out.update({
            "runs": {name: {"exit_code": r["exit_code"], "wall_s": r["wall_s"], "maxrss_kib": r["maxrss_kib"],
                            "tree_peak_rss_kib": r["tree_peak_rss_kib"],
                            "fps": r["report"].get("throughput", {}).get("fps"),
                            "nodes": node_table(r["report"]), **checked[name]["figures"],
                            "checks": checked[name]["checks"]} for name, r in runs.items()},
            "detections": {k: v for k, v in same.items() if k != "differing"} | {"differing": same["differing"][:50]},
            "memory_growth": growth, "all_goals_held": bool(ok), "seconds": time.monotonic() - started})
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1, default=str))
    print(f"every goal held: {bool(ok)} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
