"""The driver of a cluster run (in the runner's process): connects to Ray, places one
``NodeRunner`` actor per alive node, and hands out chunks to whichever node is ready.

Faults: a chunk whose actor or node died comes back to the queue whole (its partial outputs
never left the dead node) and goes to another node; with no node left, what remains is lost,
with the reason. Ctrl-C (or SIGTERM): every node's current runner gets SIGINT and drains (a
partial report), nothing more is handed out (those frames are cancelled); a second Ctrl-C is
passed on too, and the runner kills its pipeline.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field

from cluster.chunks import Chunk, Unit, WorkQueue
from cluster.node import REPO_ROOT, NodeRunner

log = logging.getLogger("cluster")

WAIT_POLL_S = 1.0  # ray.wait's timeout: how often the loop looks at signals and dead nodes
DRAIN_TIMEOUT_S = 120.0  # after Ctrl-C, the longest wait for the nodes' partial reports
ACTOR_START_TIMEOUT_S = 120.0


class RayMissing(RuntimeError):
    """--ray without the ray package installed."""


class Interrupted(Exception):
    """SIGTERM on the driver, handled like Ctrl-C."""


@dataclass
class Node:
    """One node of the cluster and its actor; ``gone`` says why it takes no more chunks."""

    index: int
    node_id: str
    address: str
    cpus: int
    gpus: int
    actor: object = None
    host: str = ""
    gone: str = ""
    fps: float | None = None  # frames per second of its pipeline, measured on its chunks
    busy_s: float = 0.0
    processed: int = 0

    @property
    def label(self) -> str:
        return f"node-{self.index}"


@dataclass
class ChunkRun:
    """A chunk handed to a node, and what came back (``result``) or why nothing did (``lost``)."""

    chunk: Chunk
    node: Node
    result: dict | None = None
    lost: str = ""


@dataclass
class ClusterRun:
    """Everything the merge needs: the nodes, each chunk run, and the units never run."""

    nodes: list[Node]
    runs: list[ChunkRun] = field(default_factory=list)
    lost: list[tuple[Unit, str]] = field(default_factory=list)
    cancelled: list[Unit] = field(default_factory=list)
    interrupted_by: int = 0  # the signal that stopped the run, or 0
    requeued: list[dict] = field(default_factory=list)
    connect_s: float = 0.0


def import_ray():
    """The ray module, or RayMissing naming the package to install."""
    try:
        import ray
    except ImportError:
        raise RayMissing("--ray needs the ray package, which is not installed: pip install -r requirements-ray.txt "
                         "(ray==2.60.0)") from None
    return ray


def connect(ray, address: str) -> None:
    """Join the cluster at ``address`` ("auto": the one this host belongs to); the actors import
    this repository, at the same path on every node."""
    ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": REPO_ROOT}}, log_to_driver=False,
             logging_level=logging.WARNING, configure_logging=False)


def place_nodes(ray, use_gpus: bool) -> list[Node]:
    """One actor on each alive node that has a CPU, pinned there, sized from its resources."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    found = sorted((n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1),
                   key=lambda n: n["NodeID"])
    nodes = []
    for index, info in enumerate(found):
        gpus = int(info["Resources"].get("GPU", 0)) if use_gpus else 0
        node = Node(index, info["NodeID"], info.get("NodeManagerAddress", ""), int(info["Resources"]["CPU"]), gpus)
        strategy = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
        # num_cpus=0: the actor only waits on its runner; the runner's processes use the node's cores.
        node.actor = ray.remote(NodeRunner).options(num_cpus=0, num_gpus=gpus, scheduling_strategy=strategy,
                                                    max_restarts=0).remote(node.label)
        nodes.append(node)
    for node in nodes:
        node.host = ray.get(node.actor.describe.remote(), timeout=ACTOR_START_TIMEOUT_S)["host"]
    return nodes


def node_config(config: dict, node: Node) -> dict:
    """The run's settings for ``node``: automatic worker counts (0) become its CPU count there,
    not this host's; with GPUs, one inference process per GPU Ray gave the actor."""
    sized = dict(config)
    for key in ("workers", "pre_workers", "post_workers"):
        sized[key] = sized[key] or node.cpus
    if not sized["infer_workers"]:
        sized["infer_workers"] = node.gpus if node.gpus and sized["device"] != "cpu" else node.cpus
    return sized


class Dispatcher:
    """The loop: hand a chunk to each idle node, wait for any chunk, account for it, repeat."""

    def __init__(self, ray, nodes: list[Node], queue: WorkQueue, config: dict):
        self.ray, self.nodes, self.queue, self.config = ray, nodes, queue, config
        self.in_flight: dict = {}  # ObjectRef -> ChunkRun
        self.run = ClusterRun(nodes)
        self.stopping = 0  # Ctrl-Cs seen

    def alive(self) -> list[Node]:
        return [n for n in self.nodes if not n.gone]

    def share(self, node: Node) -> float:
        """``node``'s part of the alive nodes' speed; an unmeasured node counts as their mean."""
        alive = self.alive()
        known = [n.fps for n in alive if n.fps]
        mean = sum(known) / len(known) if known else 1.0
        speed = {n.index: n.fps or mean for n in alive}
        return speed[node.index] / sum(speed.values())

    def hand_out(self) -> None:
        busy = {r.node.index for r in self.in_flight.values()}
        for node in self.alive():
            if node.index in busy or not self.queue or self.stopping:
                continue
            chunk = self.queue.take(node.fps, self.share(node))
            synthetic = chunk.frames if chunk.synthetic else 0
            ref = node.actor.run_chunk.remote(chunk.index, node_config(self.config, node), chunk.list_text(), synthetic)
            self.in_flight[ref] = ChunkRun(chunk, node)
            log.info("%s (%s): chunk %d, frames %d..%d", node.label, node.node_id[:12], chunk.index, chunk.first_id,
                     chunk.first_id + chunk.frames - 1)

    def loop(self) -> ClusterRun:
        while True:
            try:
                self.hand_out()
                if not self.in_flight:
                    break
                ready, _ = self.ray.wait(list(self.in_flight), num_returns=1, timeout=WAIT_POLL_S)
                for ref in ready:
                    self.collect(ref)
            except (KeyboardInterrupt, Interrupted) as exc:
                self.stop(signal.SIGTERM if isinstance(exc, Interrupted) else signal.SIGINT)
        self.finish()
        return self.run

    def collect(self, ref) -> None:
        run = self.in_flight.pop(ref)
        try:
            run.result = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as exc:
            self.node_gone(run, f"its actor died ({type(exc).__name__})")
            return
        except self.ray.exceptions.RayError as exc:
            self.node_gone(run, f"Ray failed the chunk ({type(exc).__name__}: {str(exc).splitlines()[0]})")
            return
        code = run.result["exit_code"]
        if code == 2 or (code != 0 and "report.json" not in run.result["files"] and not self.stopping):
            self.node_gone(run, f"its runner exited with code {code} without a report: "
                                f"{run.result['stderr_tail'].strip().splitlines()[-1:] or ''}")
            return
        self.run.runs.append(run)
        self.measure(run)
        if code == 1:
            run.node.gone = f"its pipeline aborted: {_reason(run.result)}"
            log.error("%s: %s", run.node.label, run.node.gone)

    def measure(self, run: ChunkRun) -> None:
        """The node's speed from its chunks' own figures: frames over the runner's wall time,
        start-up excluded (the chunk size already pays for that once)."""
        import json
        report = json.loads(run.result["files"].get("report.json", b"{}") or b"{}")
        wall = (report.get("throughput") or {}).get("wall_s") or 0.0
        processed = (report.get("frames") or {}).get("processed", 0)
        run.node.busy_s += wall
        run.node.processed += processed
        if run.node.busy_s > 0 and run.node.processed:
            run.node.fps = run.node.processed / run.node.busy_s

    def node_gone(self, run: ChunkRun, reason: str) -> None:
        """The chunk goes back to the queue whole; its node takes no more work."""
        run.node.gone = reason
        log.warning("%s: %s; chunk %d (%d frames) goes to another node", run.node.label, reason, run.chunk.index,
                    run.chunk.frames)
        self.run.requeued.append({"chunk": run.chunk.index, "node": run.node.label, "frames": run.chunk.frames,
                                  "reason": reason})
        self.queue.hand_back(run.chunk)
        if not self.alive():
            reason = "no node left: " + "; ".join(f"{n.label} {n.gone}" for n in self.nodes)
            self.run.lost += [(u, reason) for u in self.queue.drain()]

    def stop(self, sig: int) -> None:
        """Ctrl-C or SIGTERM: pass SIGINT to each running chunk (twice: the runner kills)."""
        self.stopping += 1
        self.run.interrupted_by = self.run.interrupted_by or sig
        log.warning("interrupted: the nodes drain their chunks%s", " (again: they stop now)" if self.stopping > 1 else
                    "; Ctrl-C again to stop them at once")
        for run in self.in_flight.values():
            try:
                run.node.actor.interrupt.remote()
            except Exception:  # an actor already gone answers through its chunk's result
                pass
        if self.stopping == 1:
            self.run.cancelled += self.queue.drain()

    def finish(self) -> None:
        """Chunks handed back while stopping were never run: cancelled. Each node's temporary
        folder goes."""
        self.run.cancelled += self.queue.drain()
        for node in self.nodes:
            if not node.gone:
                try:
                    self.ray.get(node.actor.close.remote(), timeout=30)
                except Exception as exc:  # the run is done; its node's temporary folder stays
                    log.warning("%s: could not remove its temporary folder (%s)", node.label, exc)


def _reason(result: dict) -> str:
    import json
    try:
        return json.loads(result["stdout"]).get("reason") or "no reason given"
    except ValueError:
        return (result.get("stderr_tail") or "").strip().splitlines()[-1:] or "no reason given"


def run_cluster(address: str, config: dict, units: list[Unit], chunk_s: float, use_gpus: bool) -> ClusterRun:
    """Connect, place the actors, run every unit once; Ray is shut down on the way out."""
    ray = import_ray()
    started = time.perf_counter()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        connect(ray, address)
        signal.signal(signal.SIGTERM, _raise_interrupted)  # after ray.init, which sets its own
        nodes = place_nodes(ray, use_gpus)
        if not nodes:
            raise RuntimeError(f"the Ray cluster at {address!r} has no alive node with a CPU")
        connect_s = time.perf_counter() - started
        log.info("cluster: %d nodes (%s) in %.1f s", len(nodes),
                 ", ".join(f"{n.label} {n.host} {n.cpus} CPU{f' {n.gpus} GPU' if n.gpus else ''}" for n in nodes),
                 connect_s)
        result = Dispatcher(ray, nodes, WorkQueue(units, chunk_s), config).loop()
        result.connect_s = connect_s
        return result
    finally:
        signal.signal(signal.SIGTERM, previous)
        ray.shutdown()


def _raise_interrupted(_signum, _frame) -> None:
    raise Interrupted()


