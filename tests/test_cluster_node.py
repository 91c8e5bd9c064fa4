"""The node actor's own parts without Ray (cluster/node.py): finishing twice gives one result,
what the collector journaled is what the node finished, and its folder goes on close."""

from __future__ import annotations

import asyncio
import json
import os
import time

from cluster.node import FeedRun, NodeRunner
from cluster.outbox import Outbox
from collector.journal import JOURNAL_NAME


def make_runner(tmp_path, monkeypatch) -> NodeRunner:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return NodeRunner("node-x")


def fake_run(runner: NodeRunner, readers: int = 2) -> FeedRun:
    folder = os.path.join(runner.work_dir, "run-0")
    os.makedirs(os.path.join(folder, "run"))
    feeds = [open(os.path.join(folder, f"{r}.jsonl"), "ab", buffering=0) for r in range(readers)]
    runner.run = FeedRun(folder, os.path.join(folder, "run"), feeds, [[] for _ in range(readers)], time.time(),
                         done_by_reader=[0] * readers, outbox=Outbox(os.path.join(folder, "run")))
    return runner.run


def test_finishing_twice_waits_for_one_runner_and_gives_one_result(tmp_path, monkeypatch):
    runner = make_runner(tmp_path, monkeypatch)

    async def scenario():
        fake_run(runner)
        runner.proc = await asyncio.create_subprocess_exec("sh", "-c", "sleep 0.3; echo '{}'",
                                                           stdout=asyncio.subprocess.PIPE)
        runner.waiter = asyncio.ensure_future(runner.proc.communicate())
        first, second = await asyncio.gather(runner.finish(), runner.finish())
        again = await runner.finish()
        await runner.close()
        return first, second, again

    first, second, again = asyncio.run(scenario())
    assert first is second is again and first["exit_code"] == 0 and first["stdout"].strip() == "{}"
    assert not os.path.exists(runner.work_dir)


def test_pulled_chunks_come_again_until_acknowledged_and_the_last_removes_the_runs_folder(tmp_path, monkeypatch):
    runner = make_runner(tmp_path, monkeypatch)

    async def scenario():
        run = fake_run(runner, readers=1)
        await runner.feed([([5], {"kind": "synthetic", "location": "", "name": "s/5.jpg", "frames": 1, "item": 5})])
        os.makedirs(os.path.join(run.folder, "run", "images", "s"))
        with open(os.path.join(run.folder, "run", "images", "s", "5.jpg"), "wb") as f:
            f.write(b"x" * 10)
        with open(os.path.join(run.folder, "run", "report.json"), "w") as f:
            json.dump({"frames": {"processed_ids": [[0, 0]], "failures": []}}, f)
        run.outbox.finished(json.loads(open(os.path.join(run.folder, "run", "report.json")).read()))
        first = await runner.pull(4, 0)
        again = await runner.pull(4, 0)
        rest = [await runner.pull(4, first["seq"])]
        while not rest[-1]["done"]:
            rest.append(await runner.pull(4, rest[-1]["seq"]))
        return run, first, again, rest

    run, first, again, rest = asyncio.run(scenario())
    assert again is first and first["pieces"] == [("images/s/5.jpg", 0, b"xxxx", False)]
    assert [p[1:] for c in rest for p in c["pieces"]] == [(4, b"xxxx", False), (8, b"xx", True)]
    assert [f for c in rest for f in c["frames"]] == [(5, None)], "delivered once its file went"
    assert not os.path.exists(run.folder) and runner.run is None


def test_progress_counts_each_journaled_frame_once_per_reader_and_survives_a_cut_journal(tmp_path, monkeypatch):
    runner = make_runner(tmp_path, monkeypatch)

    async def scenario():
        run = fake_run(runner)
        await runner.feed([([10], {"kind": "synthetic", "location": "", "name": "s/10.jpg", "frames": 1, "item": 10}),
                           ([11], {"kind": "synthetic", "location": "", "name": "s/11.jpg", "frames": 1, "item": 11}),
                           ([12], {"kind": "synthetic", "location": "", "name": "s/12.jpg", "frames": 1, "item": 12})])
        runner.proc = await asyncio.create_subprocess_exec("sleep", "30")
        journal = os.path.join(run.folder, "run", JOURNAL_NAME)
        lines = [json.dumps({"f": [0, 1, 0, 0, 0, 0, 0, [], []]}), json.dumps({"failed": {"id": 1}}),
                 json.dumps({"stats": {"name": "pre-0"}}), json.dumps({"f": [0, 1, 0, 0, 0, 0, 0, [], []]})]
        with open(journal, "w") as f:
            f.write("\n".join(lines) + "\n" + '{"f": [2, 1')  # the last line still being written
        first = await runner.progress()
        with open(journal, "w") as f:  # a restarted collector cut its journal back and goes on
            f.write(lines[0] + "\n" + json.dumps({"f": [2, 1, 0, 0, 0, 0, 0, [], []]}) + "\n")
        second = await runner.progress()
        runner.proc.kill()
        await runner.proc.wait()
        await runner.close()
        return run, first, second

    run, first, second = asyncio.run(scenario())
    assert run.ids == [[10, 12], [11]], "each unit to the reader with the least work left"
    assert first == {"fed": 3, "done": 2, "exit_code": None}
    assert second["done"] == 3 and run.done_by_reader == [2, 1]


def test_the_guard_removes_the_ipc_folder_a_killed_runner_left(tmp_path, monkeypatch):
    """A runner killed without draining leaves its ipc folder; its guard removes it (named as
    wire.ipc_dirs names it: the guard imports nothing of the project, so the prefix is checked here)."""
    from cluster import guard
    from wire.ipc_dirs import IPC_DIR_PREFIX

    assert guard.IPC_DIR_PREFIX == IPC_DIR_PREFIX
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    left = tmp_path / f"{IPC_DIR_PREFIX}4242-abcd"
    other = tmp_path / f"{IPC_DIR_PREFIX}4243-abcd"
    left.mkdir()
    other.mkdir()
    guard.remove_ipc_leftovers(4242)
    assert not left.exists() and other.exists()
