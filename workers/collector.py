"""Collector: receives every result, failure and worker summary, keeps the ledger of frame
ids (frames in = processed + failed is checked, not assumed), and writes the run folder."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time

import zmq

from workers.lifecycle import Control, StageArgs, poll, Clock, set_thread_counts, setup_logging
from analysis.report import RunData, write_run_folder
from workers.transport import make_socket, recv_message, send_message
from yolo.timing import aggregate, forward_stats

POLL_TIMEOUT_MS = 100
PROGRESS_INTERVAL_S = 0.25
DRAIN_AFTER_STOP_S = 3.0  # after a stop, wait this long for the workers' last summaries


class Ledger:
    """Every planned frame id ends up processed or failed with a reason."""

    def __init__(self, total: int):
        self.total = total
        self.processed: dict[int, dict] = {}
        self.failed: dict[int, dict] = {}

    def add_result(self, result: dict) -> None:
        self._check_new(result["id"])
        self.processed[result["id"]] = result

    def add_failure(self, failure: dict) -> None:
        self._check_new(failure["id"])
        self.failed[failure["id"]] = failure

    def _check_new(self, frame_id: int) -> None:
        if not 0 <= frame_id < self.total:
            raise RuntimeError(f"ledger: expected a frame id in [0, {self.total}), got {frame_id}")
        if frame_id in self.processed or frame_id in self.failed:
            raise RuntimeError(f"ledger: frame {frame_id} reported twice")

    def done(self) -> int:
        return len(self.processed) + len(self.failed)

    def complete(self) -> bool:
        return self.done() == self.total

    def fail_missing(self, plan, reason: str) -> int:
        missing = [i for i in range(self.total) if i not in self.processed and i not in self.failed]
        for i in missing:
            self.failed[i] = {"id": i, "name": plan.ref(i).name, "stage": "unknown", "worker": None,
                              "reason": reason}
        return len(missing)


def environment(cfg, workers: list[dict], startup_s: float) -> dict:
    import torch
    versions = {name: _version(name) for name in
                ("torch", "torchvision", "opencv-python-headless", "numpy", "pyzmq", "msgpack")}
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu_cores": os.cpu_count(),
           **versions, "libzmq": zmq.zmq_version(), "cuda_available": torch.cuda.is_available(),
           "startup_s": startup_s, "devices": {},
           "threads_per_process": {w["name"]: w.get("threads") for w in workers}}
    for device in cfg.devices:
        if device.startswith("cuda") and torch.cuda.is_available():
            env["devices"][device] = torch.cuda.get_device_name(torch.device(device))
        else:
            env["devices"][device] = platform.processor() or platform.machine()
    return env


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run(args: StageArgs, expected_workers: list[str], started_s: float) -> None:
    threads = set_thread_counts(args.torch_threads, args.opencv_threads)
    log = setup_logging(args.name, args.log_path, args.config.log_level)
    plan = args.plan
    ctx = zmq.Context()
    control = Control(ctx, args.endpoints.control, args.parent_pid)
    results_in = make_socket(ctx, zmq.PULL)
    results_in.bind(args.endpoints.collector)
    progress_out = make_socket(ctx, zmq.PUSH)
    progress_out.connect(args.endpoints.progress)
    poller = zmq.Poller()
    poller.register(results_in, zmq.POLLIN)
    poller.register(control.socket, zmq.POLLIN)
    ledger = Ledger(plan.total)
    stats: dict[str, dict] = {}
    bytes_in = messages_in = 0
    clock = Clock()
    last_progress = 0.0
    stop_deadline = None
    try:
        while len(stats) < len(expected_workers):
            if control.should_stop() and stop_deadline is None:
                stop_deadline = time.perf_counter() + DRAIN_AFTER_STOP_S
            if stop_deadline is not None and time.perf_counter() > stop_deadline:
                break
            events = poll(poller, POLL_TIMEOUT_MS, clock, blocked_on_output=False)
            if results_in in events:
                t0 = time.perf_counter()
                while True:  # drain what is queued before the next progress report
                    try:
                        msg = recv_message(results_in, flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    bytes_in += msg.nbytes
                    messages_in += 1
                    kind = msg.header["type"]
                    if kind == "result":
                        ledger.add_result(msg.header)
                    elif kind == "failed":
                        ledger.add_failure(msg.header)
                    elif kind == "stats":
                        stats[msg.header["name"]] = msg.header
                    else:
                        log.warning("ignoring a message of unknown type %r", kind)
                clock.busy_s += time.perf_counter() - t0
            if control.socket in events:
                control.handle()
            if time.perf_counter() - last_progress > PROGRESS_INTERVAL_S:
                _send_progress(progress_out, ledger)
                last_progress = time.perf_counter()
        finished_s = time.perf_counter()
        _send_progress(progress_out, ledger)
        missing_workers = [w for w in expected_workers if w not in stats]
        if not ledger.complete():
            reason = (f"not completed: {control.stop_reason}" if control.stop_reason else
                      "lost: never reached the collector although every worker finished")
            lost = ledger.fail_missing(plan, reason)
            log.warning("%d frames did not complete (%s)", lost, reason)
        if missing_workers:
            log.warning("no summary from %s", ", ".join(missing_workers))
        collector_stats = {"name": args.name, "role": "collector", "pid": os.getpid(), "device": "cpu",
                           "threads": threads, "frames": len(ledger.processed), "busy_s": clock.busy_s,
                           "wait_in_s": clock.wait_in_s, "blocked_out_s": 0.0, "wall_s": clock.wall_s(),
                           "frame_ms": [], "bytes_in": bytes_in, "messages_in": messages_in,
                           "bytes_out": 0, "messages_out": 0, "substages_ms": {}}
        run_data = _run_data(args, ledger, stats, collector_stats, started_s, finished_s, control.stop_reason)
        summary = write_run_folder(args.run_dir, run_data)
        send_message(progress_out, {"type": "finished", "summary": summary,
                                    "stopped": control.stop_reason, "missing_workers": missing_workers})
    finally:
        results_in.close()
        progress_out.close()
        control.close()
        ctx.term()


def _send_progress(progress_out, ledger: Ledger) -> None:
    send_message(progress_out, {"type": "progress", "processed": len(ledger.processed),
                                "failed": len(ledger.failed), "total": ledger.total})


def _run_data(args: StageArgs, ledger: Ledger, stats: dict, collector_stats: dict, started_s: float,
              finished_s: float, stop_reason: str | None) -> RunData:
    cfg = args.config
    frames, detections = [], []
    # Throughput counts from the first frame read, not from process start-up (imports, model load).
    first_read = min((r["t"]["read_start"] for r in ledger.processed.values()), default=started_s)
    for frame_id in sorted(ledger.processed):
        r = ledger.processed[frame_id]
        frames.append({"id": frame_id, "name": r["name"], "workers": r.get("workers", {}), "t": r["t"],
                       "batch": r.get("batch", 1), "detections": len(r["detections"]),
                       "image_saved": r.get("image_saved", False)})
        detections.extend(r["detections"])
    workers = [stats[name] for name in sorted(stats)] + [collector_stats]
    exports = [w["timing"] for w in workers if w.get("timing")]
    links = {}
    for w in workers:
        if w.get("link"):
            link = links.setdefault(w["link"], {"frames": 0, "bytes": 0})
            link["frames"] += w.get("messages_out", 0)
            link["bytes"] += w.get("bytes_out", 0)
    spans = [{"worker": w["name"], "pid": w["pid"], "name": s[0], "start_s": s[1], "dur_ms": s[2], "depth": s[3]}
             for w in workers if w.get("timing") for s in w["timing"].get("spans", [])]
    for w in workers:
        w.pop("timing", None)
        w.pop("type", None)
        w.setdefault("batches", 0)
    config = cfg.as_dict()
    config["stopped"] = stop_reason
    return RunData(run_id=os.path.basename(args.run_dir), config=config, environment=environment(cfg, workers, first_read - started_s),
                   frames_in=ledger.total, warmup=cfg.warmup, started_s=first_read, finished_s=finished_s,
                   frames=frames, failed=[ledger.failed[i] for i in sorted(ledger.failed)],
                   detections=detections, workers=workers, links=links,
                   module_rows=[r.as_dict() for r in aggregate(exports)] if exports else [],
                   forward=forward_stats(exports), module_spans=spans)
