"""The cluster driver's faults on fake actors (no Ray): a runner that aborts, one that exits 2, a
node that dies, every node gone, Ctrl-C; each time the merged ledger accounts for every frame once.
(tests/test_cluster.py runs the real thing on simulated Ray nodes.)"""

from __future__ import annotations

import json
import signal

import pytest

from cluster import driver as driver_module
from cluster.driver import Dispatcher, Node, NodeRun
from cluster.inbox import Inbox, Received
from cluster.ray_session import ClusterUnreachable, check_address
from cluster.report import ledger
from cluster.work import Unit, WorkQueue


class RayError(Exception):
    pass


class RayActorError(RayError):
    pass


class GetTimeoutError(RayError):
    pass


class Ref:
    """A call made when submitted, as Ray starts it then; ``get`` gives its value or raises."""

    def __init__(self, call):
        try:
            self.value, self.error = call(), None
        except RayError as exc:
            self.value, self.error = None, exc

    def result(self):
        if self.error is not None:
            raise self.error
        if getattr(self.value, "interrupt_transfer", False):  # a Ctrl-C while the outputs come
            self.value.interrupt_transfer = False
            raise KeyboardInterrupt
        return self.value


class FakeRay:
    """Every call is done when submitted; every finish is ready at once."""

    class exceptions:
        pass

    exceptions.RayError, exceptions.RayActorError, exceptions.GetTimeoutError = RayError, RayActorError, GetTimeoutError

    def get(self, ref, timeout=None):
        return ref.result()

    def wait(self, refs, num_returns=1, timeout=None):
        return list(refs), []

    def __init__(self):
        self.killed = []

    def kill(self, actor):
        self.killed.append(actor)


class Method:
    def __init__(self, function):
        self.function = function

    def remote(self, *args):
        return Ref(lambda: self.function(*args))


class Result(dict):
    """A runner's result; ``interrupt_transfer``: a Ctrl-C comes while the driver fetches it."""

    interrupt_transfer = False


class FakeNode:
    """A node's actor and its one-reader pipeline: it finishes ``speed`` frames each time it is
    asked its progress; ``abort_after`` frames in, its runner exits 1; ``dies_after`` frames in,
    its actor dies; ``exit_2``: its runner exits 2 at once."""

    def __init__(self, speed: int, abort_after: int | None = None, dies_after: int | None = None,
                 exit_2: bool = False, dies_finishing: bool = False, interrupt_transfer: bool = False):
        self.speed, self.abort_after, self.dies_after, self.exit_2 = speed, abort_after, dies_after, exit_2
        self.dies_finishing, self.interrupt_transfer = dies_finishing, interrupt_transfer
        self.starts = 0
        self.ids: list[int] = []
        self.done = 0
        self.dead = False
        self.interrupted = 0  # SIGINTs passed on to its runner
        self.sent = 0  # frames delivered through pull
        self.chunks = 0
        self.finished = False
        for name in ("start", "feed", "progress", "finish", "interrupt", "close", "describe", "pull"):
            setattr(self, name, Method(getattr(self, "_" + name)))

    def _alive(self):
        if self.dead:
            raise RayActorError("the actor died")

    def _start(self, config, readers):
        self._alive()
        self.ids, self.done, self.sent, self.finished = [], 0, 0, False
        self.starts += 1

    def _feed(self, units):
        self._alive()
        for ids, _fields in units:
            self.ids += ids

    def _progress(self):
        self._alive()
        if self.dies_after is not None and self.done >= self.dies_after:
            self.dead = True
            self._alive()
        if not self.interrupted:
            self.done = min(len(self.ids), self.done + self.speed)
        aborted = self.abort_after is not None and self.done >= self.abort_after
        if aborted:
            self.done = self.abort_after
        return {"fed": len(self.ids), "done": self.done, "exit_code": 2 if self.exit_2 else 1 if aborted else None}

    def _finish(self):
        self._alive()
        if self.dies_finishing:
            self.dead = True
            self._alive()
        if self.exit_2:
            return {"exit_code": 2, "stdout": "", "stderr_tail": "error: weights not found", "files": {},
                    "ids": [self.ids], "started_unix": 0.0, "finished_unix": 1.0}
        aborted = self.abort_after is not None and self.done >= self.abort_after
        done = self.done if aborted or self.interrupted else len(self.ids)
        code = 1 if aborted else 130 if self.interrupted else 0
        report = {"frames": {"in": done, "processed": done, "failed": 0, "lost": 0, "cancelled": 0,
                             "failures": [], "cancelled_ids": [], "processed_ids": [[0, done - 1]] if done else []},
                  "throughput": {"measured_frames": done, "window_s": 1.0, "window_start_unix": 0.0,
                                 "window_end_unix": 1.0, "wall_s": 1.0},
                  "summary": {"cpu_ms_per_frame": 5.0, "bound_fps": 100.0, "bottleneck": "infer"},
                  "frame_latency_ms": [10.0] * done}
        stdout = json.dumps({"reason": "inference crashed 4 times"}) if aborted else "{}"
        result = Result(exit_code=code, stdout=stdout, stderr_tail="", ids=[list(self.ids)], started_unix=0.0,
                        files={"report.json": json.dumps(report).encode()}, finished_unix=1.0)
        result.interrupt_transfer, self.interrupt_transfer = self.interrupt_transfer, False
        self.finished = True
        return result

    def _pull(self, max_bytes, acknowledged):
        """Delivers the frames done but the newest one (its files still being written) while the
        runner runs, everything it did once it finished."""
        self._alive()
        upto = self.done if self.finished else max(self.sent, self.done - 1)
        frames = [(i, None) for i in self.ids[self.sent:upto]]
        self.sent = upto
        self.chunks += 1
        return {"seq": self.chunks, "pieces": [], "frames": frames, "records": [], "done": self.finished}

    def _interrupt(self):
        self.interrupted += 1
        return True

    def _close(self):
        pass

    def _describe(self):
        return {"host": "fake"}


def run_fake(nodes: list[FakeNode], frames: int, stop_after_steps: tuple[int, ...] = (), monkeypatch=None,
             run_dir=None):
    monkeypatch.setattr(driver_module.time, "sleep", lambda _s: None)
    config = {"batch_size": 1, "prefetch": 1, "infer_workers": 1, "post_workers": 1, "pre_workers": 1}
    placed = []
    for index, fake in enumerate(nodes):
        node = Node(index, f"id{index}", "", 1, 0, actor=fake, host="fake", config=config)
        placed.append(node)
    units = [Unit(i, 1, "synthetic", "", f"synthetic/{i:05d}.jpg", i) for i in range(frames)]
    ray = FakeRay()
    dispatcher = Dispatcher(ray, placed, WorkQueue(units), 1.0, Inbox(str(run_dir)))
    if stop_after_steps:
        steps = {"count": 0}
        original = dispatcher.step

        def step_then_interrupt():
            original()
            steps["count"] += 1
            if steps["count"] in stop_after_steps:
                raise KeyboardInterrupt

        dispatcher.step = step_then_interrupt
    cluster = dispatcher.loop()
    cluster.killed = ray.killed
    return cluster


def processed_ids(cluster) -> list[int]:
    """The global ids of every frame processed: by the runs that came back (their reports) and
    those delivered by runs lost mid-way; sorted, repeats kept."""
    reported = [run.global_id(i) for run in cluster.runs if "report.json" in run.result["files"]
                for first, last in json.loads(run.result["files"]["report.json"])["frames"]["processed_ids"]
                for i in range(first, last + 1)]
    salvaged = [i for run in cluster.salvaged for i, failure in run.received.delivered.items() if failure is None]
    return sorted(reported + salvaged)


def accounted(cluster, frames: int) -> dict:
    result = ledger(cluster, frames)
    assert result["accounted"] and result["in"] == frames, result
    return result


def test_a_runner_that_aborts_keeps_what_it_did_and_its_unread_frames_go_to_the_other_node(monkeypatch, tmp_path):
    nodes = [FakeNode(speed=2, abort_after=5), FakeNode(speed=3)]
    cluster = run_fake(nodes, 200, monkeypatch=monkeypatch, run_dir=tmp_path)
    result = accounted(cluster, 200)
    assert result["processed"] == 200
    assert cluster.nodes[0].gone == "its pipeline aborted: inference crashed 4 times"
    assert cluster.requeued and "before reading them" in cluster.requeued[0]["reason"]
    assert processed_ids(cluster) == list(range(200)), "every frame once"


def test_a_node_that_dies_keeps_what_it_delivered_and_gives_back_the_rest(monkeypatch, tmp_path):
    nodes = [FakeNode(speed=2, dies_after=6), FakeNode(speed=3)]
    cluster = run_fake(nodes, 100, monkeypatch=monkeypatch, run_dir=tmp_path)
    result = accounted(cluster, 100)
    assert result["processed"] == 100 and result["lost"] == 0 and result["processed_twice"] == 0
    assert "actor died" in cluster.nodes[0].gone
    assert [run.node.index for run in cluster.runs] == [1]  # the dead node's run never came back whole
    delivered = sorted(cluster.salvaged[0].received.delivered)
    assert delivered == nodes[0].ids[:len(delivered)] and 0 < len(delivered) < 6, "whole frames, in feed order"
    assert processed_ids(cluster) == list(range(100))
    assert cluster.requeued[0]["frames"] == len(nodes[0].ids) - len(delivered)


def test_a_runner_that_exits_2_gives_back_all_it_was_fed(monkeypatch, tmp_path):
    nodes = [FakeNode(speed=2, exit_2=True), FakeNode(speed=3)]
    cluster = run_fake(nodes, 50, monkeypatch=monkeypatch, run_dir=tmp_path)
    result = accounted(cluster, 50)
    assert result["processed"] == 50
    assert "exited with code 2" in cluster.nodes[0].gone and "weights not found" in cluster.nodes[0].gone
    assert cluster.killed == [nodes[0]], "a node given up alive is ended, its runner with it"
    assert processed_ids(cluster) == list(range(50))


def test_with_no_node_left_the_rest_is_lost_with_the_reason(monkeypatch, tmp_path):
    nodes = [FakeNode(speed=2, dies_after=4), FakeNode(speed=2, dies_after=4)]
    cluster = run_fake(nodes, 60, monkeypatch=monkeypatch, run_dir=tmp_path)
    result = accounted(cluster, 60)
    kept = sum(len(run.received.delivered) for run in cluster.salvaged)
    assert 0 < kept < 8 and result["processed"] == kept, "what the nodes delivered before they died counts"
    assert result["lost"] == 60 - kept
    assert all("no node left" in f["reason"] for f in result["failures"])


def test_ctrl_c_cancels_what_was_never_fed_or_never_read(monkeypatch, tmp_path):
    nodes = [FakeNode(speed=2), FakeNode(speed=3)]
    cluster = run_fake(nodes, 500, stop_after_steps=(4,), monkeypatch=monkeypatch, run_dir=tmp_path)
    result = accounted(cluster, 500)
    assert cluster.interrupted_by == signal.SIGINT
    assert 0 < result["processed"] < 500 and result["cancelled"] == 500 - result["processed"]
    assert [fake.interrupted for fake in nodes] == [1, 1]


def test_a_second_ctrl_c_right_after_a_finish_call_is_passed_on_and_counts_nothing_twice(monkeypatch, tmp_path):
    """The second Ctrl-C comes just after the driver asked node 1 for its outputs, before it noted
    the call: it asks again (the actor answers both with one result) and passes the Ctrl-C on."""
    nodes = [FakeNode(speed=2), FakeNode(speed=3)]
    calls = {"finish": 0}

    def finish_then_ctrl_c():
        calls["finish"] += 1
        result = nodes[1]._finish()
        if calls["finish"] == 1:
            raise KeyboardInterrupt
        return result

    nodes[1].finish = Method(finish_then_ctrl_c)
    cluster = run_fake(nodes, 500, stop_after_steps=(4,), monkeypatch=monkeypatch, run_dir=tmp_path)
    accounted(cluster, 500)
    assert [fake.interrupted for fake in nodes] == [2, 2] and calls["finish"] == 2


def test_a_ctrl_c_while_a_nodes_outputs_come_waits_for_them_again(monkeypatch, tmp_path):
    nodes = [FakeNode(speed=2, interrupt_transfer=True), FakeNode(speed=3)]
    cluster = run_fake(nodes, 80, monkeypatch=monkeypatch, run_dir=tmp_path)
    result = accounted(cluster, 80)
    assert cluster.interrupted_by == signal.SIGINT
    assert sorted(run.node.index for run in cluster.runs) == [0, 1], "node 0's outputs were kept"
    assert result["processed"] + result["cancelled"] == 80 and result["processed"] >= nodes[0].done


def test_a_node_that_dies_while_finishing_has_its_units_run_again_by_a_new_runner(monkeypatch, tmp_path):
    nodes = [FakeNode(speed=2, dies_finishing=True), FakeNode(speed=3)]
    cluster = run_fake(nodes, 90, monkeypatch=monkeypatch, run_dir=tmp_path)
    result = accounted(cluster, 90)
    assert result["processed"] == 90 and processed_ids(cluster) == list(range(90))
    assert nodes[1].starts == 2, "the node that had finished started a second runner for them"
    assert "actor died" in cluster.nodes[0].gone


@pytest.mark.parametrize("address, fragment", [("nonsense", "HOST:PORT"), ("host:", "HOST:PORT"),
                                               ("127.0.0.1:notaport", "HOST:PORT")])
def test_a_malformed_address_is_named(address, fragment):
    with pytest.raises(ClusterUnreachable, match=fragment):
        check_address(address)


def test_chunks_are_written_under_their_names_as_they_come_and_a_chunk_sent_again_changes_nothing(tmp_path):
    from cluster.inbox import unused_name
    inbox = Inbox(str(tmp_path))
    got = Received()
    records = [{"image": "a.jpg", "frame": 7, "class_id": 0, "class": "person", "score": 0.9, "box": [1.0, 2, 3, 4]},
               {"image": "d.jpg", "frame": 3, "class_id": 0, "class": "person", "score": 0.8, "box": [1.0, 2, 3, 4]}]
    first = {"seq": 1, "pieces": [("images/a.jpg", 0, b"AB", True), ("videos/clip.mp4", 0, b"fir", False)],
             "frames": [(7, None), (3, None)], "records": records, "done": False}
    inbox.receive(got, "node-0-0", first)
    assert (tmp_path / "images" / "a.jpg").read_bytes() == b"AB" and not (tmp_path / "videos" / "clip.mp4").exists()
    second = {"seq": 2, "pieces": [("videos/clip.mp4", 3, b"st part", True)], "frames": [(9, {"reason": "x"})],
              "records": [], "done": True}
    inbox.receive(got, "node-0-0", second)
    inbox.receive(got, "node-0-0", second)  # the driver was stopped while writing it: it came again
    assert (tmp_path / "videos" / "clip.mp4").read_bytes() == b"first part"
    other = Received()
    inbox.receive(other, "node-1-0", {"seq": 1, "pieces": [("videos/clip.mp4", 0, b"the rest", True)], "frames": [],
                                      "records": [records[0]], "done": True})
    assert (tmp_path / "videos" / "clip.part2.mp4").read_bytes() == b"the rest"
    assert got.delivered == {7: None, 3: None, 9: {"reason": "x"}}
    written = inbox.write_lists(["person"])
    merged = json.loads((tmp_path / "detections.json").read_text())
    assert [(r["frame"], r["image"]) for r in merged] == [(3, "d.jpg"), (7, "a.jpg")], "each frame's records once"
    assert written["files"] == {"images": 1, "labels": 0, "crops": 0, "videos": 2} and written["detections"] == 2
    assert not list(tmp_path.rglob(".*")), "no partial or spill file left"
    assert unused_name("videos/x.mp4", {"videos/x.mp4", "videos/x.part2.mp4"}) == "videos/x.part3.mp4"


def test_a_runner_lost_mid_file_leaves_no_partial_copy(tmp_path):
    inbox = Inbox(str(tmp_path))
    got = Received()
    inbox.receive(got, "node-0-0", {"seq": 1, "pieces": [("images/big.jpg", 0, b"half", False)], "frames": [],
                                    "records": [], "done": False})
    inbox.abandon(got)
    assert not list(tmp_path.rglob("*.partial")) and not (tmp_path / "images" / "big.jpg").exists()


def test_sigterm_while_ray_joins_is_interrupted_and_signals_at_the_end_are_only_said(monkeypatch, caplog):
    """ray.init answers SIGTERM with sys.exit(15): joining turns it into Interrupted (exit 143,
    not 15). Once the run is over, SIGINT and SIGTERM are said and the writing goes on."""
    import os

    from cluster import ray_session

    class JoiningRay:
        def init(self, **kwargs):
            raise SystemExit(signal.SIGTERM)

        def shutdown(self):
            pass

    monkeypatch.setattr(ray_session, "import_ray", lambda: JoiningRay())
    with pytest.raises(ray_session.Interrupted):
        with ray_session.joined("auto"):
            pass
    with ray_session.signals_noted():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        written = True
    assert written and "nearly done" in caplog.text


def test_device_auto_is_each_nodes_own_and_the_driver_checks_as_for_cpu():
    from cluster.command import driver_config
    from cluster.driver import node_config
    from settings.config import RunConfig
    config = {"device": "auto", "workers": 0, "pre_workers": 0, "post_workers": 0, "infer_workers": 0}
    gpu, cpu = Node(0, "a", "", 8, 2), Node(1, "b", "", 4, 0)
    assert (node_config(config, gpu)["device"], node_config(config, gpu)["infer_workers"]) == ("cuda", 2)
    assert (node_config(config, cpu)["device"], node_config(config, cpu)["infer_workers"]) == ("cpu", 4)
    assert driver_config(RunConfig(device="auto")).device == "cpu" and driver_config(RunConfig()).device == "cpu"


def test_a_sample_of_the_source_is_looked_at_from_each_node(tmp_path):
    from cluster.reach import sampled_locations, unreachable
    units = [Unit(i, 1, "image", str(tmp_path / f"{i}.jpg"), f"{i}.jpg", i) for i in range(7)]
    assert sampled_locations(units) == [units[0].location, units[3].location, units[6].location]
    assert sampled_locations([Unit(0, 1, "synthetic", "", "s/0.jpg", 0)]) == []
    (tmp_path / "0.jpg").write_bytes(b"x")
    assert unreachable(units[0].location) is None and unreachable(units[1].location) == "no such file or directory"
    assert unreachable("http://127.0.0.1:1/x.mp4") is None, "OpenCV's URLs are their reader's to judge"
