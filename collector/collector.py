"""Collector: receives every result, failure and worker summary, keeps the ledger of frame ids
(frames in = processed + failed + cancelled is checked, not assumed), writes annotated videos in
frame order, samples every process's CPU and memory, and writes the run folder. Imports no torch."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time

import zmq

from collector.journal import BATCH_LINES, Journal, Resume, frame_row, reload
from analysis.machine import usable_cores
from backends.registry import backend_packages
from inputs.kinds import input_kind
from collector.ledger import Expected, Ledger, account_missing
from process.stage_loop import Stage, StageProcess, run_loop
from wire.links import SlotReturns
from wire.messages import DONE, FAILED, RESULT, RESULTS, SCHEMAS, STATS, Finished, Progress, check_fields, done_item, validate
from process.resources import ResourceSampler
from sharedmem.slots import SlotError, SlotViews
from wire.transport import REPORT_LIMITS, DropCounter, ProtocolError, make_socket, recv_message, send_message
from collector.videos import AnnotatedVideos
from workers.store import run_root
from wire.wiring import StageArgs

PROGRESS_INTERVAL_S = 0.25  # at most this often, and only when a count changed
RESOURCE_INTERVAL_S = 0.5  # the report interpolates each process's CPU between samples: coarser ones smear start-up into the window
IDLE_WAKE_S = 1.0  # with nothing due, the loop still looks this often (is the runner alive?)
DRAIN_AFTER_STOP_S = 3.0  # after a stop, wait this long for the workers' last summaries
DRAIN_GAP_S = 0.05  # after a drain that took few frames (a light load), the collector waits this long before looking again
VIDEO_DRAIN_GAP_S = 0.01  # the same while it writes annotated videos: each frame it holds keeps a slot lent
DRAIN_GAP_FRAMES = BATCH_LINES  # a drain that took this many frames or more is followed by no wait: under a heavy
# load the queue is taken as it comes, so a collector killed leaves few frames unwritten (postprocess resends its last ones)
WRITE_EVERY_FRAMES = BATCH_LINES  # new frames' records are written at least this often (the journal's batch)
WRITE_EVERY_S = 0.25  # and at least this often (with the progress report: one wake-up for both)
COLLECTOR_TYPES = frozenset({RESULTS, RESULT, FAILED, STATS})
POLLIN = int(zmq.POLLIN)  # a plain int: `&` on pyzmq's flag enum costs more than the socket option read
DONE_FIELDS = SCHEMAS[DONE]


class Collected:
    """What the collector keeps while the run goes: the ledger, the summaries, the outputs."""

    def __init__(self, args: StageArgs, expected_workers: list[str], ctx: zmq.Context, log, drops: DropCounter,
                 resume: Resume | None = None):
        self.args, self.log, self.drops = args, log, drops
        self.ledger = Ledger(args.plan)
        self.expected = Expected(list(expected_workers))
        from analysis.atomic import JsonListFile
        from analysis.report import json_text
        # A restarted collector goes on with what its predecessor wrote durably (the journal).
        reloaded = reload(args.run_dir) if resume is not None else None
        lists = reloaded.lists if reloaded else {}
        # Written as they arrive, not held: a long run's collector keeps only the ledger's rows.
        self.detections = JsonListFile(os.path.join(args.run_dir, "detections.json"), json_text,
                                       lists.get("detections.json"))
        self.predictions = JsonListFile(os.path.join(args.run_dir, "predictions.json"), json_text,
                                        lists.get("predictions.json"))
        self.journal = Journal(args.run_dir, log, reloaded.journal_end if reloaded else None)
        self.image_error: str | None = None
        self.unwritten: list[dict] = []  # new frames whose records wait for the next write
        self.unwritten_since = 0.0
        root = run_root(args.config.results, args.run_dir)
        self.videos = AnnotatedVideos(args.run_dir, list(args.names), args.config.save_every,
                                      args.config.draw_options(), store=root if root != args.run_dir else "")
        self.views = SlotViews(args.run_tag)
        self.returns = SlotReturns(ctx, args)
        self.bytes_in = self.messages_in = 0
        if resume is not None:
            self._take_back(reloaded.entries, resume)

    def _take_back(self, entries: list[dict], resume: Resume) -> None:
        """A restarted collector's state: its predecessor's journal, the deaths it did not hear of,
        and no wait for a worker that exited before now without a summary journaled."""
        for entry in entries:
            if "f" in entry:
                self.ledger.add_result(frame_row(entry["f"]))
            elif "failed" in entry:
                self.ledger.add_failure(entry["failed"])
            elif "stats" in entry:
                self.expected.add_stats(entry["stats"])
        for notice in resume.notices:
            self.expected.gone(notice)
        self.expected.abandoned.update(n for n in resume.exited if n not in self.expected.stats)
        self.log.warning("restarted: %d processed and %d failed frames, %d worker summaries taken back from the "
                         "journal", len(self.ledger.processed), len(self.ledger.failed), len(self.expected.stats))

    def take(self, header: dict, arrays: list) -> None:
        kind = header["type"]
        if kind == RESULTS:
            self._results(header["items"], arrays)
        elif kind == RESULT:
            self._results([done_item(header)], arrays)
        elif kind == FAILED:
            if self.ledger.add_failure(header):
                self.journal.failed(header)
                if isinstance(header.get("video"), dict):
                    self.videos.skip(header["name"], header.get("cycle") or 0, header["video"])
        elif kind == STATS:
            self.expected.add_stats(header)
            self.journal.stats(header)

    def _results(self, items: list, arrays: list) -> None:
        """A batch of finished frames: the new ones into the ledger, their records (JSON text
        already) appended to the lists in one write each, then the journal lines that vouch for
        them; video frames to their writer."""
        taken = []
        for item in items:
            try:
                taken.append((check_fields(item, DONE_FIELDS, DONE), False))
            except ProtocolError as exc:
                self.drops.note(exc, "results")
        taken = [(item, self.ledger.add_result(item)) for item, _ in taken]
        new = [item for item, is_new in taken if is_new]
        if new:
            if not self.unwritten:
                self.unwritten_since = time.perf_counter()
            self.unwritten += new
            if len(self.unwritten) >= WRITE_EVERY_FRAMES:
                self.write()
            error = next((i["image_error"] for i in new if i.get("image_error")), None)
            if error and self.image_error is None:
                self.image_error = error
                self.log.error("%s", self.image_error)
        for item, is_new in taken:
            if isinstance(item.get("video"), dict) and "px" in item:
                try:
                    self._video_frame(item, is_new, arrays)
                except SlotError as exc:
                    self.drops.note(ProtocolError("slot", str(exc)), "results")

    def write_due(self) -> bool:
        return bool(self.unwritten) and time.perf_counter() - self.unwritten_since >= WRITE_EVERY_S

    def write(self) -> None:
        """The records of the frames taken since the last write, one write per list, then the
        journal lines that vouch for them (a collector killed before loses at most
        WRITE_EVERY_FRAMES frames, which postprocess sends again)."""
        new, self.unwritten = self.unwritten, []
        if new:
            found = self.detections.extend_text([(i["detections_json"], i["detections"]) for i in new])
            predicted = self.predictions.extend_text([(i["predictions_json"], i["predictions"]) for i in new])
            for item, lists in zip(new, zip(found, predicted)):
                self.journal.frame(item, lists)
        self.journal.flush()

    def _video_frame(self, item: dict, new: bool, arrays: list) -> None:
        release = lambda: self.returns.release(item["id"], item.get("pre"), item.get("px"))  # noqa: E731 - called once the frame is written
        if not new:
            release()
            return
        orig = item["px"].get("orig")
        self.videos.add(item["name"], item.get("cycle") or 0, item["video"], item.get("draw") or [],
                        lambda: self.views.array(orig, arrays), release)

    def finish_outputs(self) -> tuple[list[str], dict[str, str]]:
        """Close detections.json and predictions.json: (written, {name: error})."""
        self.write()
        written, failed = [], {}
        for output in (self.detections, self.predictions):
            name = os.path.basename(output.path)
            if output.skipped:
                self.log.error("%s: %d records were not plain JSON and were left out", name, output.skipped)
            if output.finish():
                written.append(name)
            else:
                failed[name] = output.error or "not written"
        return written, failed

    def close(self) -> None:
        self.journal.close()
        self.detections.abandon()
        self.predictions.abandon()
        self.views.close()
        self.returns.close()


def environment(cfg, workers: list[dict], startup_s: float) -> dict:
    versions = {name: _version(name) for name in
                (*backend_packages(), "opencv-python-headless", "numpy", "pyzmq", "msgpack", "psutil")}
    return {"python": platform.python_version(), "platform": platform.platform(), "cpu_cores": usable_cores(),
            "processor": platform.processor() or platform.machine(), **versions, "libzmq": zmq.zmq_version(),
            "startup_s": startup_s, "devices": list(cfg.devices),
            "threads_per_process": {w["name"]: w.get("threads") for w in workers},
            "torch_loaded": {w["name"]: w.get("torch_loaded") for w in workers}}


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class Collector(Stage):
    """Takes every result, failure and summary until each worker's summary is in (or, after a
    stop, DRAIN_AFTER_STOP_S more), then writes the run folder."""

    def __init__(self, process: StageProcess):
        args = process.args
        self.process, self.args, self.log = process, args, process.log
        self.results_in = process.own(make_socket(process.ctx, zmq.PULL, max_message_bytes=REPORT_LIMITS.header_bytes,
                                                  curve=args.wire.curve, curve_server=True))
        self.results_in.bind(args.endpoints["collector"])
        process.listen(self.results_in, self.receive)
        self.progress_out = process.own(make_socket(process.ctx, zmq.PUSH, curve=args.wire.curve))
        self.progress_out.connect(args.endpoints["progress"])
        self.collected = process.own(Collected(args, list(args.workers), process.ctx, process.log, process.drops,
                                               args.resume))
        self.sampler = process.own(ResourceSampler(args.runner_pid))
        self.last_progress = self.last_sample = 0.0
        self.progress_sent: tuple[int, int] | None = None  # (processed, failed) the runner was last told
        self.stop_deadline: float | None = None
        self.drain_gap_s = VIDEO_DRAIN_GAP_S if args.config.save_every > 0 and any(
            input_kind(item.kind).video for item in args.plan.items) else DRAIN_GAP_S

    def keep_going(self, control) -> bool:
        if control.should_stop() and self.stop_deadline is None:
            self.stop_deadline = time.perf_counter() + DRAIN_AFTER_STOP_S
        past_deadline = self.stop_deadline is not None and time.perf_counter() > self.stop_deadline
        return bool(self.collected.expected.waiting_for()) and not past_deadline

    def peer_gone(self, notice: dict) -> None:
        self.collected.expected.gone(notice)

    def step(self) -> bool:
        if self.collected.write_due():
            self.collected.write()
        now = time.perf_counter()
        if self._counts() != self.progress_sent and now - self.last_progress >= PROGRESS_INTERVAL_S:
            self.progress_sent = _send_progress(self.progress_out, self.collected.ledger, self.args)
            self.last_progress = now
        if now - self.last_sample >= RESOURCE_INTERVAL_S:
            self.sampler.sample()
            self.last_sample = now
        return False

    def poll_timeout_ms(self) -> float:
        """Until the next thing due (a write, a progress report of new counts, a sample), at most
        IDLE_WAKE_S: an idle collector wakes about once a second, not ten times."""
        now = time.perf_counter()
        due = [self.last_sample + RESOURCE_INTERVAL_S, now + IDLE_WAKE_S]
        if self.collected.unwritten:
            due.append(self.collected.unwritten_since + WRITE_EVERY_S)
        if self._counts() != self.progress_sent:
            due.append(self.last_progress + PROGRESS_INTERVAL_S)
        if self.stop_deadline is not None:
            due.append(self.stop_deadline)
        return max(0.0, 1e3 * (min(due) - now)) + 1  # +1: wake just after it is due, not just before

    def _counts(self) -> tuple[int, int]:
        ledger = self.collected.ledger
        return len(ledger.processed), len(ledger.failed)

    def receive(self, socket) -> None:
        with self.process.clock.busy():
            taken = _drain_results(socket, self.collected, self.args, self.process.drops)
        if taken < DRAIN_GAP_FRAMES:
            time.sleep(self.drain_gap_s)  # what arrives meanwhile is taken in one drain: fewer wake-ups

    def finish(self) -> None:
        process, collected, log, args = self.process, self.collected, self.log, self.args
        control = process.control
        finished_s = time.perf_counter()
        log.info("every summary in (%d processed, %d failed): writing the run folder",
                 len(collected.ledger.processed), len(collected.ledger.failed))
        self.sampler.sample(final=True)
        _send_progress(self.progress_out, collected.ledger, args)
        videos = collected.videos.finish()
        stop_reason = control.stop_reason or control.drain_reason
        account_missing(collected.ledger, collected.expected, stop_reason,
                        cancel_unread=control.drain_reason is None or control.drain_cancels)
        collector_stats = process.summary("collector", len(collected.ledger.processed), bytes_in=collected.bytes_in,
                                          messages_in=collected.messages_in, bytes_out=0, messages_out=0)
        run_data = _run_data(args, collected, collector_stats, args.runner_started_s, finished_s, control,
                             self.sampler, args.machine, videos)
        summary, written, write_error = _write_run_folder(args.run_dir, run_data, *collected.finish_outputs(),
                                                        shown_as=run_root(args.config.results, args.run_dir))
        log.info("run folder written in %.2f s", time.perf_counter() - finished_s)
        finished = Finished(summary, written, write_error, missing_workers=collected.expected.waiting_for())
        send_message(self.progress_out, finished.to_message(), token=args.wire.token)


def run(args: StageArgs) -> None:
    """A restarted collector (``args.resume``) goes on from what its predecessor wrote."""
    process = StageProcess(args, use_torch=False)
    run_loop(process, Collector(process))


def _drain_results(results_in, collected: Collected, args: StageArgs, drops: DropCounter) -> int:
    """Everything queued, before the next progress report; returns the frames it held (results
    and failures). A whole message is there when the socket says POLLIN (ZeroMQ delivers all
    its parts or none), so no receive ends in zmq.Again: raising it cost more than taking a
    one-frame message."""
    frames = 0
    while results_in.get(zmq.EVENTS) & POLLIN:
        try:
            msg = recv_message(results_in, token=args.wire.token, limits=REPORT_LIMITS)
            header = validate(msg.header, COLLECTOR_TYPES)
        except ProtocolError as exc:
            drops.note(exc, "results")
            continue
        collected.bytes_in += msg.nbytes
        collected.messages_in += 1
        frames += len(header["items"]) if header["type"] == RESULTS else 1
        try:
            collected.take(header, msg.arrays)
        except SlotError as exc:
            drops.note(ProtocolError("slot", str(exc)), "results")
    return frames


def _send_progress(progress_out, ledger: Ledger, args: StageArgs) -> tuple[int, int]:
    """The counts to the runner; returns (processed, failed) as sent."""
    progress = Progress(len(ledger.processed), len(ledger.failed), ledger.plan.total)
    send_message(progress_out, progress.to_message(), token=args.wire.token)
    return progress.processed, progress.failed


def _sources(workers: list[dict], videos: list[dict]) -> dict:
    streams = [s for w in workers for s in w.get("streams") or ()]
    return {"streams": streams, "stream_errors": [e for w in workers for e in w.get("stream_errors") or ()],
            "dropped_at_source": sum(s.get("dropped", 0) for s in streams), "videos": videos}


def _run_data(args, collected: Collected, collector_stats, runner_started_s, finished_s, control, sampler, machine,
              videos):
    from analysis.report import RunData
    from yolo.module_stats import aggregate, forward_stats
    cfg, ledger, expected = args.config, collected.ledger, collected.expected
    frames = ledger.frames()
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
    sources = {**_sources(workers, videos), "skipped": list(args.plan.skipped),
               "skipped_files": args.plan.skipped_files}
    for w in workers:
        if isinstance(w.get("exit_usage"), dict):
            sampler.add_exit_usage(w["name"], w["pid"], w["exit_usage"])
        w.pop("exit_usage", None)
        w.pop("timing", None)
        w.pop("type", None)
        w.setdefault("batches", 0)
    config = cfg.as_dict()
    config["stopped"] = control.stop_reason or control.drain_reason
    fields = dict(
        run_id=os.path.basename(args.run_dir), config=config,
        environment=environment(cfg, workers, first_read - runner_started_s),
        frames_in=ledger.frames_in, warmup=cfg.warmup, started_s=first_read, finished_s=finished_s, frames=frames,
        failed=[ledger.failed[i] for i in sorted(ledger.failed)], detections=None, workers=workers,
        links=links, module_rows=[r.as_dict() for r in aggregate(exports)] if exports else [],
        forward=forward_stats(exports), module_spans=spans, resources=sampler.export(), restarts=restarts,
        cancelled=[ledger.cancelled[i] for i in sorted(ledger.cancelled)], machine=machine,
        stop={"reason": control.stop_reason or control.drain_reason, "signal": control.signal},
        outputs={"images_saved": sum(w.get("images_saved", 0) for w in workers),
                 "image_error": collected.image_error or collected.videos.error},
        duplicates=ledger.duplicates, predictions=None, sources=sources,
        machine_cpu=sampler.machine_cpu)
    return RunData(**fields)


def _write_run_folder(run_dir: str, run_data, streamed: list[str], streamed_failed: dict[str, str],
                      shown_as: str = "") -> tuple[dict, list[str], str | None]:
    """(summary, files written, the first write error); a disk-full folder still gives a summary.
    ``streamed`` and ``streamed_failed``: the files the collector wrote as the run went;
    ``shown_as``: the run folder as the summary names it (its URL when the runner uploads it)."""
    from analysis.report import write_run_folder
    summary = write_run_folder(run_dir, run_data, shown_as)
    files = summary.pop("files", {"written": [], "failed": {}})
    failed = {**streamed_failed, **(files.get("failed") or {})}
    files["written"] = list(files.get("written") or ()) + streamed
    error = next((f"{name}: {reason}" for name, reason in failed.items()), None)
    return summary, list(files.get("written") or ()), error
