"""The driver of a cluster run (in the runner's process): connects to Ray, places one
``NodeRunner`` actor per alive node, starts a runner on each, and keeps each node's feed its
pipeline's depth plus ``lead_s`` seconds of its work ahead of what it finished.

A node that goes faster finishes its feed sooner and so is given more; when the queue is empty
every feed is ended, and each runner finishes what it holds. Each node's outputs come while it
runs, a chunk of at most ``CHUNK_BYTES`` at a time (cluster/outbox.py, cluster/inbox.py), and
the rest once its runner exited (the node is "draining" then).

Faults: a node whose actor died (the node with it) keeps what it delivered (whole units: frames
journaled, records and files received) and gives back the rest of its current run, which goes
first to the other nodes; an idle node starts a new runner for them. A runner that aborted keeps what its report accounts for, and what it never read
goes back. With no node left, what remains is lost, with the reason. Ctrl-C (or SIGTERM): every
runner gets SIGINT and drains (a partial report); nothing more is fed (those frames are
cancelled); a second Ctrl-C is passed on too, and the runners kill their pipelines.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field

from cluster.inbox import Inbox, Received
from cluster.node import NodeRunner
from cluster.ray_session import Interrupted
from cluster.reach import check_reach
from cluster.work import Unit, WorkQueue, continued_videos, lead_frames, pipeline_depth, undone_parts

log = logging.getLogger("cluster")

POLL_S = 0.25  # how often the feeds are topped up and the runners looked at
CALL_TIMEOUT_S = 60.0  # an actor that does not answer a quick call in this long is taken as gone
ACTOR_START_TIMEOUT_S = 120.0
CHUNK_BYTES = 8 << 20  # file bytes in one pulled chunk: what the driver holds of a node's outputs at once
PULL_BUDGET_S = 0.2  # a node's chunks pulled one after another in a step, while they come full
AUTO_DEVICE = "auto"  # --device auto: each node's own (cuda where it has a GPU)
IDLE, RUNNING, FINISHING, DRAINING = "idle", "running", "finishing", "draining"


@dataclass
class NodeRun:
    """A runner on a node, the units fed to it, what it delivered (``received``), what came
    back at its exit (``result``), and the frames handed back then (``returned``)."""

    node: Node
    index: int
    units: list[Unit] = field(default_factory=list)
    result: dict | None = None
    received: Received = field(default_factory=Received)
    returned: set[int] = field(default_factory=set)
    abort_reason: str = ""

    def global_id(self, local: int) -> int:
        ids = self.result["ids"]
        return ids[local % len(ids)][local // len(ids)]


@dataclass
class Node:
    """One node of the cluster and its actor; ``gone`` says why it takes no more work."""

    index: int
    node_id: str
    address: str
    cpus: int
    gpus: int
    actor: object = None
    host: str = ""
    gone: str = ""
    config: dict = field(default_factory=dict)
    state: str = IDLE
    run: NodeRun | None = None
    finish_ref: object = None
    fps: float | None = None  # frames per second of its current runner, measured on what it finished
    first_done: tuple[float, int] | None = None
    runs: int = 0
    acknowledged: int = 0  # the last chunk of its outputs written here

    @property
    def label(self) -> str:
        return f"node-{self.index}"


@dataclass
class ClusterRun:
    """Everything the merge needs: the nodes, each runner's run, and the units never run."""

    nodes: list[Node]
    runs: list[NodeRun] = field(default_factory=list)
    lost: list[tuple[Unit, str]] = field(default_factory=list)
    cancelled: list[Unit] = field(default_factory=list)
    interrupted_by: int = 0  # the signal that stopped the run, or 0
    requeued: list[dict] = field(default_factory=list)
    connect_s: float = 0.0
    salvaged: list[NodeRun] = field(default_factory=list)  # runs lost mid-way: what they delivered counts
    inbox: Inbox | None = None


def place_nodes(ray, use_gpus: bool, config: dict) -> list[Node]:
    """One actor on each alive node that has a CPU, pinned there, sized from its resources."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    found = sorted((n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1),
                   key=lambda n: n["NodeID"])
    nodes = []
    for index, info in enumerate(found):
        gpus = int(info["Resources"].get("GPU", 0)) if use_gpus else 0
        node = Node(index, info["NodeID"], info.get("NodeManagerAddress", ""), int(info["Resources"]["CPU"]), gpus)
        node.config = node_config(config, node)
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
    not this host's; with GPUs, one inference process per GPU Ray gave the actor; ``--device
    auto`` is cuda where Ray gave the actor a GPU, else cpu."""
    sized = dict(config)
    if sized["device"] == AUTO_DEVICE:
        sized["device"] = "cuda" if node.gpus else "cpu"
    for key in ("workers", "pre_workers", "post_workers"):
        sized[key] = sized[key] or sized["workers"] or node.cpus
    if not sized["infer_workers"]:
        sized["infer_workers"] = node.gpus if node.gpus and sized["device"] != "cpu" else node.cpus
    return sized


class Dispatcher:
    """The loop: start runners on idle nodes, top up the running ones' feeds, end the feeds when
    the queue is empty, collect what each runner sends back."""

    def __init__(self, ray, nodes: list[Node], queue: WorkQueue, lead_s: float, inbox: Inbox):
        self.ray, self.nodes, self.queue, self.lead_s, self.inbox = ray, nodes, queue, lead_s, inbox
        self.run = ClusterRun(nodes, inbox=inbox)
        self.stopping = 0  # Ctrl-Cs seen

    def alive(self, state: str | None = None) -> list[Node]:
        return [n for n in self.nodes if not n.gone and (state is None or n.state == state)]

    def loop(self) -> ClusterRun:
        while True:
            try:
                self.step()
                if not self.alive(RUNNING) and not self.alive(FINISHING) and not self.alive(DRAINING) and (
                        not self.queue or self.stopping or not self.alive()):
                    break
                self.wait_for_finishers()
            except (KeyboardInterrupt, Interrupted) as exc:
                self.stop(signal.SIGTERM if isinstance(exc, Interrupted) else signal.SIGINT)
        self.close_nodes()
        return self.run

    def step(self) -> None:
        if self.queue and not self.stopping:
            for node in self.alive(IDLE):
                self.start_runner(node)
        for node in self.alive(RUNNING):
            self.top_up(node)
        for node in self.alive(RUNNING) + self.alive(FINISHING) + self.alive(DRAINING):
            self.pull(node)
        if not self.queue or self.stopping:
            for node in self.alive(RUNNING):
                self.end_feed(node)

    def start_runner(self, node: Node) -> None:
        node.run = NodeRun(node, node.runs)
        node.runs += 1
        node.fps, node.first_done = None, None
        node.state = RUNNING  # first: a Ctrl-C during the call still stops the runner it may have started
        try:
            self.ray.get(node.actor.start.remote(node.config, node.config["pre_workers"]), timeout=CALL_TIMEOUT_S)
        except self.ray.exceptions.RayError as exc:
            self.node_gone(node, _ray_reason(self.ray, exc))
            return
        log.info("%s (%s): runner %d started", node.label, node.node_id[:12], node.run.index)

    def top_up(self, node: Node) -> None:
        """Feed ``node`` up to its lead; a runner that exited on its own is collected."""
        try:
            progress = self.ray.get(node.actor.progress.remote(), timeout=CALL_TIMEOUT_S)
        except self.ray.exceptions.RayError as exc:
            self.node_gone(node, _ray_reason(self.ray, exc))
            return
        if progress["exit_code"] is not None:
            self.end_feed(node)
            return
        self.measure(node, progress["done"])
        want = lead_frames(node.fps, pipeline_depth(node.config), node.config["pre_workers"], self.lead_s)
        short = want - (progress["fed"] - progress["done"])
        if short <= 0 or not self.queue or self.stopping:
            return
        units = self.queue.take(short)
        node.run.units += units  # first: whatever happens to the call, they are the run's to account for
        try:
            self.ray.get(node.actor.feed.remote([(list(u.ids), dataclasses.asdict(u.entry())) for u in units]),
                         timeout=CALL_TIMEOUT_S)
        except self.ray.exceptions.RayError as exc:
            self.node_gone(node, _ray_reason(self.ray, exc))

    def pull(self, node: Node) -> None:
        """Chunks of the node's outputs, written here as they come: one a step, more while they
        come full (within PULL_BUDGET_S); a draining node whose last chunk came is done."""
        started = time.monotonic()
        while True:
            try:
                chunk = self.ray.get(node.actor.pull.remote(CHUNK_BYTES, node.acknowledged), timeout=CALL_TIMEOUT_S)
            except self.ray.exceptions.RayError as exc:
                self.node_gone(node, _ray_reason(self.ray, exc))
                return
            self.inbox.receive(node.run.received, f"{node.label}-{node.run.index}", chunk)
            node.acknowledged = chunk["seq"]
            if chunk["done"] and node.state == DRAINING:
                self.complete(node)
                return
            full = sum(len(p[2]) for p in chunk["pieces"]) >= CHUNK_BYTES or node.state == DRAINING
            if not full or time.monotonic() - started > PULL_BUDGET_S:
                return

    def complete(self, node: Node) -> None:
        """Every output of the node's runner is here: its run counts."""
        run, node.run, node.state = node.run, None, IDLE
        self.run.runs.append(run)
        if run.abort_reason:
            node.gone = run.abort_reason
            log.error("%s: %s", node.label, node.gone)

    def measure(self, node: Node, done: int) -> None:
        """The node's speed: frames finished per second since its first finished frame."""
        now = time.monotonic()
        if node.first_done is None:
            if done:
                node.first_done = (now, done)
            return
        since, first = node.first_done
        if now - since >= 1.0 and done > first:
            node.fps = (done - first) / (now - since)

    def end_feed(self, node: Node) -> None:
        node.finish_ref = node.actor.finish.remote()
        node.state = FINISHING

    def wait_for_finishers(self) -> None:
        refs = {n.finish_ref: n for n in self.alive(FINISHING)}
        if not refs:
            if not self.alive(DRAINING):
                time.sleep(POLL_S)
            return
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=POLL_S)
        for ref in ready:
            self.collect(refs[ref], ref)

    def collect(self, node: Node, ref) -> None:
        """What a runner sent back at its exit; its outputs' last chunks follow (draining). The
        node's state changes only once it came: a Ctrl-C during the transfer leaves the same ref
        to wait on again."""
        run = node.run
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            node.finish_ref = None
            self.node_gone(node, _ray_reason(self.ray, exc))
            return
        run.result, node.finish_ref = result, None
        if run.result is None:
            node.state, node.run = IDLE, None
            return  # no runner had started (a Ctrl-C during its start)
        code, files = run.result["exit_code"], run.result["files"]
        if code == 2 or (code != 0 and "report.json" not in files and not self.stopping):
            tail = run.result["stderr_tail"].strip().splitlines()[-1:]
            self.node_gone(node, f"its runner exited with code {code} without a report: {tail or ''}")
            return
        node.state = DRAINING
        unread = unaccounted(run) if "report.json" in files else []  # else the ledger counts them all
        run.returned = {i for unit in unread for i in unit.ids}
        if unread:
            if self.stopping:
                self.run.cancelled += unread
            else:
                for unit in continued_videos(run.units, unread):
                    self.inbox.video_continued(unit.name)
                self.requeue(node, unread, f"its runner exited with code {code} before reading them")
        if code == 1:
            run.abort_reason = f"its pipeline aborted: {_reason(run.result)}"

    def node_gone(self, node: Node, reason: str) -> None:
        """What its current run delivered stays; the rest goes back to the queue (or is
        cancelled while stopping)."""
        node.gone, node.state = reason, IDLE
        run, node.run = node.run, None
        log.warning("%s: %s", node.label, reason)
        try:  # one given up alive (no answer in time, exit 2) goes: its runner and folder go with it
            self.ray.kill(node.actor)
        except Exception:  # already dead
            pass
        if run is not None:
            self.inbox.abandon(run.received)
            if run.received.delivered:
                self.run.salvaged.append(run)
            done = set(run.received.delivered) | run.returned
            undone = [part for unit in run.units for part in undone_parts(unit, done)]
            if undone and self.stopping:
                self.run.cancelled += undone
            elif undone:
                self.requeue(node, undone, reason)
        if not self.alive() and self.queue:
            reason = "no node left: " + "; ".join(f"{n.label} {n.gone}" for n in self.nodes)
            self.run.lost += [(u, reason) for u in self.queue.drain()]

    def requeue(self, node: Node, units: list[Unit], reason: str) -> None:
        frames = sum(u.frames for u in units)
        log.warning("%s: %d frames go to another node", node.label, frames)
        self.run.requeued.append({"node": node.label, "frames": frames, "reason": reason})
        self.queue.hand_back(units)

    def stop(self, sig: int) -> None:
        """Ctrl-C or SIGTERM: SIGINT to each runner (twice: the runner kills); nothing more is fed."""
        self.stopping += 1
        self.run.interrupted_by = self.run.interrupted_by or sig
        log.warning("interrupted: the nodes drain their pipelines%s",
                    " (again: they stop now)" if self.stopping > 1 else "; Ctrl-C again to stop them at once")
        for node in self.alive(RUNNING) + self.alive(FINISHING):
            try:
                node.actor.interrupt.remote()
            except Exception:  # an actor already gone answers through its finish
                pass
        self.run.cancelled += self.queue.drain()

    def close_nodes(self) -> None:
        """Units never fed are cancelled; each node's temporary folder goes (an aborted node's
        too). A Ctrl-C here skips the rest: the janitors remove the folders when Ray ends the actors."""
        self.run.cancelled += self.queue.drain()
        try:
            for node in self.nodes:
                try:
                    self.ray.get(node.actor.close.remote(), timeout=30)
                except self.ray.exceptions.RayError as exc:
                    if not node.gone:
                        log.warning("%s: could not remove its temporary folder (%s)", node.label, exc)
        except (KeyboardInterrupt, Interrupted):
            log.warning("interrupted while the nodes clean up: writing the merged report")


def unaccounted(run: NodeRun) -> list[Unit]:
    """What of the run's units its report does not account for (never read: fed after its
    readers stopped), as units or the rest of one."""
    report = json.loads(run.result["files"].get("report.json") or b"{}")
    frames = report.get("frames") or {}
    local = [i for first, last in frames.get("processed_ids", []) + frames.get("cancelled_ids", [])
             for i in range(first, last + 1)] + [f["id"] for f in frames.get("failures", [])]
    done = {run.global_id(i) for i in local}
    return [rest for rest in (u.rest(done) for u in run.units) if rest is not None]


def _ray_reason(ray, exc: Exception) -> str:
    if isinstance(exc, ray.exceptions.RayActorError):
        return f"its actor died ({type(exc).__name__})"
    if isinstance(exc, ray.exceptions.GetTimeoutError):
        return f"its actor did not answer in {CALL_TIMEOUT_S:.0f} s"
    return f"Ray failed a call ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"


def _reason(result: dict) -> str:
    try:
        return json.loads(result["stdout"]).get("reason") or "no reason given"
    except ValueError:
        return (result.get("stderr_tail") or "").strip().splitlines()[-1:] or "no reason given"


def run_cluster(ray, config: dict, units: list[Unit], lead_s: float, use_gpus: bool, on_placed) -> ClusterRun:
    """Place the actors, check they reach the source (and can write in a results store), call
    ``on_placed()`` for the run folder (the driver makes it then: a run that never reached a
    node leaves none), run every unit once, its outputs written there (or, for a store, by the
    nodes under ``RESULTS/<that folder's name>``)."""
    started = time.perf_counter()
    nodes = place_nodes(ray, use_gpus, config)
    if not nodes:
        raise RuntimeError("the Ray cluster has no alive node with a CPU")
    check_reach(ray, nodes, units, config["results"])
    connect_s = time.perf_counter() - started
    log.info("cluster: %d nodes (%s) in %.1f s", len(nodes),
             ", ".join(f"{n.label} {n.host} {n.cpus} CPU{f' {n.gpus} GPU' if n.gpus else ''}" for n in nodes),
             connect_s)
    inbox = Inbox.of_run(on_placed(), config["results"])
    for node in nodes:  # the name it was given (a store's run folder is named by it on every node)
        node.config["name"] = os.path.basename(os.path.normpath(inbox.run_dir))
    result = Dispatcher(ray, nodes, WorkQueue(units), lead_s, inbox).loop()
    result.connect_s = connect_s
    return result
