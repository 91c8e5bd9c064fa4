"""``python runner.py --ray ADDRESS``: check what a cluster run can do, run it, merge, print.

Sources: a finite list of frames visible to every node (files, folders, globs and lists on
storage every node mounts at the same path, objects in a store such as ``s3://bucket/prefix``,
or URLs; each node checks it reads a sample first), fed to the nodes unit by unit; synthetic
frames, each with its own global id and scene. A live stream is one node's: refused here (run it
without --ray).

Results: a folder on the driver (the nodes' outputs stream to it), or a store's URL: each node
writes its outputs to ``RESULTS/NAME`` itself (after each node wrote and removed a marker object
there, cluster/reach.py); the driver makes the merged report files in a private local folder and
uploads them there, report.json last (supervisor/stored_runs.py), claiming the name with a
``.running`` object while the run goes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile

from cluster.driver import AUTO_DEVICE, run_cluster
from cluster.ray_session import import_ray, joined, signals_noted
from cluster.report import write_run_folder
from cluster.work import units_of
from inputs.kinds import input_kind
from inputs.object_store import is_store_url
from inputs.sources import SYNTHETIC_SOURCE
from supervisor.prepare import make_run_dir
from supervisor.stored_runs import release_unfinished
from workers.store import run_root
from settings.config import ConfigError, RunConfig

log = logging.getLogger("cluster")


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    """--ray ADDRESS (or "auto") and --ray-lead-s: the seconds of its work a node's feed holds
    beyond what its pipeline has in flight."""

    address: str
    lead_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.address:
            raise ConfigError("--ray: expected a Ray address (host:port) or 'auto', got ''")
        if not self.lead_s > 0:
            raise ConfigError(f"--ray-lead-s: expected seconds > 0, got {self.lead_s!r}")


def check_cluster_run(cfg: RunConfig, plan) -> None:
    """What a cluster run cannot do, refused before Ray is joined (exit 2)."""
    import_ray()  # RayMissing (exit 2) names the package
    if plan.open_ended or any(input_kind(item.kind).live for item in plan.items):
        raise ConfigError("--ray: a live stream or camera is one node's: run it without --ray on the node that "
                          "reaches it")
    if cfg.duration:
        raise ConfigError("--ray: --duration is not supported on a cluster; give the frames as a source")
    if cfg.frames and cfg.source != SYNTHETIC_SOURCE:
        raise ConfigError("--ray: --frames (looping a source) is not supported on a cluster; list the files")


def driver_config(given: RunConfig) -> RunConfig:
    """What the driver checks and plans with: ``--device auto`` is each node's to resolve, so
    the driver, which runs no pipeline, checks the rest as for cpu."""
    return dataclasses.replace(given, device="cpu") if given.device == AUTO_DEVICE else given


def run_on_cluster(options: ClusterOptions, given: RunConfig, cfg: RunConfig, names, plan) -> dict:
    """Run the plan on the cluster and write the merged run folder; returns the report (its
    ``summary`` holds the exit code). ``given`` is the configuration before this host's automatic
    counts were filled in: each node fills them from its own resources."""
    units = units_of(plan, synthetic=cfg.source == SYNTHETIC_SOURCE)
    config = dataclasses.replace(given, name=cfg.name).as_dict()
    stored = is_store_url(cfg.results)
    with contextlib.ExitStack() as stack:
        local = stack.enter_context(tempfile.TemporaryDirectory(prefix="yolo-cluster-")) if stored else ""
        if stored:
            stack.callback(release_unfinished, cfg.results, local)
        with joined(options.address) as ray:
            use_gpus = given.device == AUTO_DEVICE or cfg.devices[0] != "cpu"
            cluster = run_cluster(ray, config, units, options.lead_s, use_gpus,
                                  on_placed=lambda: make_run_dir(cfg.results, cfg.name, cfg.exist_ok, local))
        run_dir = cluster.inbox.run_dir
        root = run_root(cfg.results, run_dir) if stored else ""
        config["name"] = os.path.basename(os.path.normpath(run_dir))
        with signals_noted():
            report = write_run_folder(run_dir, cluster, config["name"], config, options.address,
                                      sum(u.frames for u in units), names, store_root=root)
        return report | {"run_dir": root or run_dir}


def print_report(report: dict, as_json: bool) -> None:
    summary = dict(report["summary"], run_dir=report["run_dir"])
    if as_json:
        print(json.dumps(summary))
        return
    print(f"run {summary['run_id']}: {summary['frames_in']} frames in, {summary['processed']} processed, "
          f"{summary['failed']} failed, {summary['lost']} lost, {summary['cancelled']} cancelled")
    fps = summary["fps"]
    print(f"throughput  {fps:.2f} fps over the nodes' windows" if fps else "throughput  -")
    for node in report["cluster"]["nodes"]:
        print(f"  {node['node']:8} {node['host']:20} {node['device']:6} {node['processed']:6d} frames  "
              f"{node['fps'] or 0:8.2f} fps  {node['status']}")
    print(f"run folder  {summary['run_dir']}")
