"""``RunData``: everything the collector gathered about one run, the input of every report."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunData:
    """Times are ``time.perf_counter()`` seconds (CLOCK_MONOTONIC, shared by every process of the
    run on Linux).

    frames: one dict per processed frame: id, name, workers {"pre", "infer", "post": name}, batch,
        detections, image_saved, cold (its forward was the first of its input shape in its
        inference process), t {read_start, read_end, pre_end, infer_recv, infer_start, infer_end,
        post_start, post_end}.
    failed: {id, name, stage, worker, reason, kind: "failed" | "lost"}.
    cancelled: {id, name}: frames never started because the run was stopped.
    workers: one summary per worker process (incarnation), see ``analysis.stages``; series such as
        frame_ms are ``Samples.to_dict()`` dicts (plain lists are read too).
    resources: {process name: {"pid", "role", "samples": [[t_s, cpu_s, rss_bytes, pss_bytes]],
        optional "peak_rss_bytes": the high-water mark a worker read of itself as it exited}}.
    restarts: {name, incarnation, signal, exit_code, t_s, frames_resent}.
    machine: {"cores", "device_type": "cpu" | "cuda", "bf16"}; empty: read from environment/config.
    stop: {"reason", "signal"}; outputs: {"images_saved", "image_error"}.
    predictions: ``predictions.json`` (pycocotools' loadRes reads it).
    sources: {"streams": [inputs.streams.StreamStats as dicts], "stream_errors": [str],
        "dropped_at_source": int, "videos": [{"video", "frames", "missing", "fps"}]}.
    """

    run_id: str
    config: dict
    environment: dict
    frames_in: int
    warmup: int
    started_s: float
    finished_s: float
    frames: list[dict]
    failed: list[dict]
    detections: list[dict] | None  # None: written already, as the run went (the collector streams it)
    workers: list[dict]
    links: dict
    module_rows: list[dict]
    forward: dict
    module_spans: list[dict]
    log_file: str = "run.log"
    resources: dict = field(default_factory=dict)
    restarts: list[dict] = field(default_factory=list)
    cancelled: list[dict] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    stop: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    duplicates: int = 0  # results for a frame already accounted (sent again after a worker died), dropped
    predictions: list[dict] | None = field(default_factory=list)  # COCO results, first pass of each image; None: as detections
    sources: dict = field(default_factory=dict)
    machine_cpu: list = field(default_factory=list)  # [[t_s, busy core-seconds of the whole machine]]
