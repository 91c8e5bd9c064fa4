"""Collector: receives every result, failure and worker summary, keeps the ledger of frame ids
(frames in = processed + failed + cancelled is checked, not assumed), samples every process's
CPU and memory, and writes the run folder. Imports no torch."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import time

import zmq

from workers.lifecycle import Clock, Control, Heartbeat, StageArgs, enter_process, poll, set_thread_counts, setup_logging
from workers.messages import FAILED, FINISHED, PROGRESS, RESULT, STATS, validate
from workers.resources import ResourceSampler
from workers.transport import REPORT_LIMITS, DropCounter, ProtocolError, make_socket, recv_message, send_message

POLL_TIMEOUT_MS = 100
PROGRESS_INTERVAL_S = 0.25
RESOURCE_INTERVAL_S = 0.5
DRAIN_AFTER_STOP_S = 3.0  # after a stop, wait this long for the workers' last summaries
COLLECTOR_TYPES = frozenset({RESULT, FAILED, STATS})
FRAME_TIMES = ("read_start", "read_end", "pre_end", "infer_recv", "infer_start", "infer_end", "post_start", "post_end")


class Ledger:
    """Every planned frame id ends up processed, failed with a reason, or cancelled (never
    started because the run was stopped). A frame reported twice (sent again after a worker
    died) counts once; an id outside the plan is dropped."""

    def __init__(self, total: int):
        self.total = total
        self.processed: dict[int, tuple] = {}  # id -> compact record (see _compact)
        self.failed: dict[int, dict] = {}
        self.cancelled: dict[int, dict] = {}
        self.duplicates = 0
        self.out_of_plan = 0

    def add_result(self, result: dict) -> bool:
        if not self._is_new(result["id"]):
            return False
        self.processed[result["id"]] = _compact(result)
        return True

    def add_failure(self, failure: dict) -> bool:
        if not self._is_new(failure["id"]):
            return False
        self.failed[failure["id"]] = {k: failure[k] for k in ("id", "name", "stage", "worker", "reason")} | {
            "kind": "failed"}
        return True

    def _is_new(self, frame_id: int) -> bool:
        if not 0 <= frame_id < self.total:
            self.out_of_plan += 1
            return False
        if frame_id in self.processed or frame_id in self.failed:
            self.duplicates += 1
            return False
        return True

    def done(self) -> int:
        return len(self.processed) + len(self.failed)

    def complete(self) -> bool:
        return self.done() == self.total

    def missing(self) -> list[int]:
        return [i for i in range(self.total) if i not in self.processed and i not in self.failed
                and i not in self.cancelled]

    def lose(self, frame_id: int, name: str, stage: str, worker: str | None, reason: str) -> None:
        self.failed[frame_id] = {"id": frame_id, "name": name, "stage": stage, "worker": worker, "reason": reason,
                                 "kind": "lost"}

    def cancel(self, frame_id: int, name: str) -> None:
        self.cancelled[frame_id] = {"id": frame_id, "name": name}


def _compact(result: dict) -> tuple:
    t = result["t"]
    workers = result.get("workers") or {}
    return (result["name"], workers.get("pre"), workers.get("infer"), workers.get("post"),
            tuple(float(t.get(k, 0.0)) for k in FRAME_TIMES), int(result["batch"]), len(result["detections"]),
            bool(result["image_saved"]), bool(result["cold"]))


def _frame_dict(frame_id: int, record: tuple) -> dict:
    name, pre, infer, post, times, batch, detections, saved, cold = record
    return {"id": frame_id, "name": name, "workers": {"pre": pre, "infer": infer, "post": post},
            "t": dict(zip(FRAME_TIMES, times)), "batch": batch, "detections": detections, "image_saved": saved,
            "cold": cold}


class Expected:
    """Which workers' summaries the collector still waits for: one per name, from its latest
    incarnation; a worker gone for good (no restart) is no longer waited for."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.stats: dict[str, dict] = {}
        self.latest: dict[str, int] = {n: 0 for n in names}
        self.abandoned: set[str] = set()
        self.restarts: list[dict] = []

    def add_stats(self, stats: dict) -> None:
        name = stats["name"]
        if name in self.latest and stats["incarnation"] >= self.latest[name]:
            self.stats[name] = stats

    def gone(self, notice: dict) -> None:
        name = notice["name"]
        if name not in self.latest:
            return
        self.restarts.append({k: notice.get(k) for k in ("name", "incarnation", "signal", "exit_code", "reason",
                                                         "t_s", "final")})
        if notice["final"]:
            self.abandoned.add(name)
        else:
            self.latest[name] = max(self.latest[name], notice["incarnation"] + 1)

    def waiting_for(self) -> list[str]:
        return [n for n in self.names if n not in self.stats and n not in self.abandoned]


def environment(cfg, workers: list[dict], startup_s: float) -> dict:
    versions = {name: _version(name) for name in
                ("torch", "torchvision", "opencv-python-headless", "numpy", "pyzmq", "msgpack", "psutil")}
    return {"python": platform.python_version(), "platform": platform.platform(), "cpu_cores": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), **versions, "libzmq": zmq.zmq_version(),
            "startup_s": startup_s, "devices": list(cfg.devices),
            "threads_per_process": {w["name"]: w.get("threads") for w in workers}}


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run(args: StageArgs, expected_workers: list[str], runner_started_s: float, machine: dict) -> None:
    enter_process(args)
    threads = set_thread_counts(args.torch_threads, args.opencv_threads, use_torch=False)
    log = setup_logging(args.name, args.log_path, args.config.log_level)
    plan = args.plan
    drops = DropCounter(log)
    ctx = zmq.Context()
    control = Control(ctx, args, drops)
    heartbeat = Heartbeat(ctx, args)
    results_in = make_socket(ctx, zmq.PULL, max_message_bytes=REPORT_LIMITS.header_bytes, curve=args.wire.curve,
                             curve_server=True)
    results_in.bind(args.endpoints.collector)
    progress_out = make_socket(ctx, zmq.PUSH, curve=args.wire.curve)
    progress_out.connect(args.endpoints.progress)
    poller = zmq.Poller()
    poller.register(results_in, zmq.POLLIN)
    poller.register(control.socket, zmq.POLLIN)
    ledger = Ledger(plan.total)
    expected = Expected(expected_workers)
    sampler = ResourceSampler(args.runner_pid)
    detections: list[dict] = []
    image_error: str | None = None
    bytes_in = messages_in = 0
    clock = Clock()
    last_progress = last_sample = 0.0
    stop_deadline = None
    try:
        while expected.waiting_for():
            heartbeat.tick()
            for notice in control.take_gone():
                expected.gone(notice)
            if control.should_stop() and stop_deadline is None:
                stop_deadline = time.perf_counter() + DRAIN_AFTER_STOP_S
            if stop_deadline is not None and time.perf_counter() > stop_deadline:
                break
            events = poll(poller, POLL_TIMEOUT_MS, clock, blocked_on_output=False)
            if results_in in events:
                with clock.busy():
                    while True:  # drain what is queued before the next progress report
                        try:
                            msg = recv_message(results_in, token=args.wire.token, limits=REPORT_LIMITS,
                                               flags=zmq.NOBLOCK)
                            header = validate(msg.header, COLLECTOR_TYPES)
                        except zmq.Again:
                            break
                        except ProtocolError as exc:
                            drops.note(exc, "results")
                            continue
                        bytes_in += msg.nbytes
                        messages_in += 1
                        kind = header["type"]
                        if kind == RESULT and ledger.add_result(header):
                            detections.extend(header["detections"])
                            if header.get("image_error") and image_error is None:
                                image_error = header["image_error"]
                                log.error("%s", image_error)
                        elif kind == FAILED:
                            ledger.add_failure(header)
                        elif kind == STATS:
                            expected.add_stats(header)
            if control.socket in events:
                control.handle()
            now = time.perf_counter()
            if now - last_progress > PROGRESS_INTERVAL_S:
                _send_progress(progress_out, ledger, args)
                last_progress = now
            if now - last_sample > RESOURCE_INTERVAL_S:
                sampler.sample()
                last_sample = now
        finished_s = time.perf_counter()
        log.info("every summary in (%d processed, %d failed): writing the run folder", len(ledger.processed),
                 len(ledger.failed))
        sampler.sample()
        _send_progress(progress_out, ledger, args)
        _account_missing(ledger, plan, expected, control)
        collector_stats = {"name": args.name, "role": "collector", "incarnation": 0, "pid": os.getpid(),
                           "device": "cpu", "threads": threads, "frames": len(ledger.processed),
                           "busy_s": clock.busy_s, "busy_cpu_s": clock.busy_cpu_s, "wait_in_s": clock.wait_in_s,
                           "blocked_out_s": 0.0, "wall_s": clock.wall_s(), "frame_ms": clock.frame_ms.to_dict(),
                           "frame_cpu_ms": clock.frame_cpu_ms.to_dict(), "cpu_s": time.process_time() - clock.started_cpu_s,
                           "bytes_in": bytes_in, "messages_in": messages_in, "bytes_out": 0, "messages_out": 0,
                           "substages_ms": {}, "dropped_messages": dict(drops.counts)}
        run_data = _run_data(args, ledger, expected, collector_stats, runner_started_s, finished_s, control,
                             detections, sampler, machine, image_error)
        summary, written, write_error = _write_run_folder(args.run_dir, run_data, log)
        log.info("run folder written in %.2f s", time.perf_counter() - finished_s)
        send_message(progress_out, {"type": FINISHED, "summary": summary, "written": written,
                                    "write_error": write_error,
                                    "missing_workers": expected.waiting_for()}, token=args.wire.token)
    finally:
        heartbeat.close()
        results_in.close()
        progress_out.close()
        control.close()
        ctx.term()


def _send_progress(progress_out, ledger: Ledger, args: StageArgs) -> None:
    send_message(progress_out, {"type": PROGRESS, "processed": len(ledger.processed), "failed": len(ledger.failed),
                                "total": ledger.total}, token=args.wire.token)


def _account_missing(ledger: Ledger, plan, expected: Expected, control: Control) -> None:
    """Name, for every frame that did not complete, who held it, or that it never started."""
    missing = set(ledger.missing())
    if not missing:
        return
    holders: dict[int, str] = {}
    for stats in expected.stats.values():
        for identity, ids in (stats.get("held_by") or {}).items():
            holders.update({i: identity for i in ids})
        holders.update({i: f"{stats['name']}.{stats['incarnation']}" for i in stats.get("held") or ()})
    stopped = control.stop_reason or control.drain_reason
    never_started = _never_started(plan, expected)
    for frame_id in sorted(missing):
        name = plan.ref(frame_id).name
        if frame_id in never_started and stopped:
            ledger.cancel(frame_id, name)
        elif frame_id in holders:
            worker = holders[frame_id].rpartition(".")[0]
            ledger.lose(frame_id, name, worker.split("-")[0], worker,
                        f"lost: held by {holders[frame_id]} when the run ended ({stopped or 'no reason given'})")
        else:
            ledger.lose(frame_id, name, "unknown", None,
                        f"lost: in flight when the run ended ({stopped or 'every worker finished'})")


def _never_started(plan, expected: Expected) -> set[int]:
    pre_names = sorted(n for n in expected.names if n.startswith("pre-"))
    ids: set[int] = set()
    for name in pre_names:
        stats = expected.stats.get(name)
        if stats is None:
            continue
        share = plan.worker_ids(int(name.split("-")[1]), len(pre_names))
        ids.update(share[stats.get("position", len(share)):])
    return ids


def _run_data(args, ledger, expected, collector_stats, runner_started_s, finished_s, control, detections, sampler,
              machine, image_error):
    from analysis.report import RunData
    from yolo.module_stats import aggregate, forward_stats
    cfg = args.config
    frames = [_frame_dict(i, ledger.processed[i]) for i in sorted(ledger.processed)]
    # Throughput counts from the first frame read, not from process start-up (imports, model load).
    first_read = min((f["t"]["read_start"] for f in frames), default=finished_s)
    workers = [expected.stats[name] for name in sorted(expected.stats)] + [collector_stats]
    exports = [w["timing"] for w in workers if w.get("timing")]
    links = {}
    for w in workers:
        if w.get("link"):
            link = links.setdefault(w["link"], {"frames": 0, "bytes": 0})
            link["frames"] += w.get("messages_out", 0)
            link["bytes"] += w.get("bytes_out", 0)
    spans = [{"worker": w["name"], "pid": w["pid"], "name": s[0], "start_s": s[1], "dur_ms": s[2], "depth": s[3]}
             for w in workers if w.get("timing") for s in w["timing"].get("spans", [])]
    resent: dict[str, int] = {}
    for w in workers:
        for identity, count in (w.get("resent") or {}).items():
            resent[identity] = resent.get(identity, 0) + count
    restarts = [{**r, "frames_resent": resent.get(f"{r['name']}.{r['incarnation']}", 0)} for r in expected.restarts]
    dropped: dict[str, int] = {}
    for w in workers:
        for kind, count in (w.get("dropped_messages") or {}).items():
            dropped[f"{w['name']}:{kind}"] = count
    for w in workers:
        w.pop("timing", None)
        w.pop("type", None)
        w.setdefault("batches", 0)
    config = cfg.as_dict()
    config["stopped"] = control.stop_reason or control.drain_reason
    fields = dict(
        run_id=os.path.basename(args.run_dir), config=config,
        environment=environment(cfg, workers, first_read - runner_started_s),
        frames_in=ledger.total, warmup=cfg.warmup, started_s=first_read, finished_s=finished_s, frames=frames,
        failed=[ledger.failed[i] for i in sorted(ledger.failed)], detections=detections, workers=workers,
        links=links, module_rows=[r.as_dict() for r in aggregate(exports)] if exports else [],
        forward=forward_stats(exports), module_spans=spans, resources=sampler.export(), restarts=restarts,
        cancelled=[ledger.cancelled[i] for i in sorted(ledger.cancelled)], machine=machine,
        stop={"reason": control.stop_reason or control.drain_reason, "signal": None},
        outputs={"images_saved": sum(w.get("images_saved", 0) for w in workers), "image_error": image_error},
        dropped_messages=dropped, duplicates=ledger.duplicates)
    known = {f.name for f in dataclasses.fields(RunData)}
    return RunData(**{k: v for k, v in fields.items() if k in known})


def _write_run_folder(run_dir: str, run_data, log) -> tuple[dict, list[str], str | None]:
    """(summary, files written, the first write error); a disk-full folder still gives a summary."""
    from analysis.report import write_run_folder
    summary = write_run_folder(run_dir, run_data)
    files = summary.pop("files", {"written": [], "failed": {}})
    failed = files.get("failed") or {}
    error = next((f"{name}: {reason}" for name, reason in failed.items()), None)
    return summary, list(files.get("written") or ()), error
