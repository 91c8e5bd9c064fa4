"""A live run that has random and mutated messages thrown at every socket it binds still ends
with every frame, and counts what it dropped.

Seeds are fixed, so a failure reproduces; set FUZZ_ROUNDS and FUZZ_SEED for a longer or another search."""

from __future__ import annotations

import os
import random
import signal
import time

import msgpack
import pytest
import zmq

from supervisor.health import Health
from process.faults import TEST_SLOW_ENV
from wire.messages import (ACK, CREDIT, FAILED, HEARTBEAT, PEER_GONE, PROGRESS, RELEASE, RESULT,
                              STATS)

from tests.fuzzing import (TOKEN, FUZZ_SEED, good_headers, mutate_header, mutate_bytes, pack, fuzz_message)


LIVE_FRAMES = 80
WORKER_NAMES = {"pre-0", "infer-0", "post-0", "collector"}
ROUTED = ("pre-0", "infer-0")  # ROUTERs: a fuzzer connects a DEALER


def harmless(header: dict) -> dict:
    """A mutated message that stays valid must not be a forgery that changes the outcome (the
    fuzzer holds the token, as a run's own process does): ids outside the plan, names of no worker,
    and never a FINISHED report to the runner."""
    if isinstance(header.get("id"), int) and not isinstance(header.get("id"), bool) and header["id"] < 10**5:
        header["id"] = 10**6 + (header["id"] % 1000 if header["id"] >= 0 else 0)
    if isinstance(header.get("name"), str) and header["name"] in WORKER_NAMES:
        header["name"] = "fuzz-0"
    if header.get("signal") is not None:
        header["signal"] = None  # a SIGTERM passed on drains the run by design
    if header.get("type") == "finished":
        header["type"] = PROGRESS
    return header


def templates_for(endpoint: str) -> list[dict]:
    by_socket = {"pre-0": (CREDIT, ACK), "infer-0": (CREDIT, ACK), "pre-0-returns": (RELEASE,),
                 "collector": (RESULT, FAILED, STATS), "progress": (PROGRESS,), "health": (HEARTBEAT,)}
    kinds = by_socket.get(endpoint, ())
    return [h for h in good_headers() if h["type"] in kinds]


def throw_at(ctx, endpoints: dict[str, str], token: bytes | None, rng: random.Random, rounds: int) -> int:
    """Random and mutated messages at every bound socket of the run; returns how many went."""
    sent = 0
    sockets = []
    try:
        for name, url in endpoints.items():
            if name == "control":
                s = ctx.socket(zmq.XSUB)  # a SUB's only way to talk: (un)subscriptions, here garbage
            elif name in ROUTED:
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.IDENTITY, rng.choice([b"fuzz-0.0", b"\xff" * 8, b"post-0", b"infer-9.0"]))
            else:
                s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 10000)
            s.connect(url)
            sockets.append((name, s))
        time.sleep(0.2)  # connected before the first send
        for _ in range(rounds):
            for name, s in sockets:
                if name == "control":
                    parts = [rng.choice([b"", b"\x00", b"\x01", os.urandom(rng.randint(1, 40))])]
                elif token is None or rng.random() < 0.2:
                    parts = [mutate_bytes(rng, TOKEN)] + fuzz_message(rng, good_headers())
                else:
                    templates = templates_for(name)
                    header = harmless(mutate_header(rng, rng.choice(templates)))
                    parts = [token, pack({**header, "arrays": []})] if rng.random() < 0.7 else \
                        [token, *fuzz_message(rng, templates)]
                try:
                    s.send_multipart(parts, flags=zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    pass
        for name, s in sockets:  # and the extremes: too many parts, a part over the receiver's limit
            if name != "control":
                for parts in ([token or TOKEN] + [b"x"] * 40, [token or TOKEN, b"\x80" * (2 << 20)]):
                    try:
                        s.send_multipart(parts, flags=zmq.NOBLOCK)
                        sent += 1
                    except zmq.Again:
                        pass
        time.sleep(0.3)  # LINGER 0: let the queued messages leave before closing
    finally:
        for _, s in sockets:
            s.close()
    return sent


def read_token(ctx, control_url: str, run) -> bytes:
    """The run's token as a process of the run receives it: from the runner's broadcast, which a
    worker's death triggers (a peer-gone notice). Reachable only for the user who owns the ipc folder."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(control_url)
    try:
        time.sleep(0.3)  # subscribed before the broadcast
        run.wait_for_stage("post-0").send_signal(signal.SIGKILL)
        assert sub.poll(10000), "no broadcast after a worker died"
        token, header = sub.recv_multipart()[:2]
        assert msgpack.unpackb(header)["type"] == PEER_GONE
        return token
    finally:
        sub.close()


@pytest.fixture(scope="module")
def fuzzed_run(tmp_path_factory):
    from tests.live_run import SMALL_RUN, start_run
    tmp_path = tmp_path_factory.mktemp("fuzzed")
    run = start_run(tmp_path, *SMALL_RUN, "--preset", "none", "--frames", str(LIVE_FRAMES), "--save-images", "1",
                    env={TEST_SLOW_ENV: "post:30"})
    try:
        run.wait_for_images(3)
        (ipc_dir,) = run.ipc_dirs()
        endpoints = {p.stem: f"ipc://{p}" for p in ipc_dir.glob("*.ipc")}
        assert set(endpoints) == {"pre-0", "pre-0-returns", "infer-0", "collector", "control", "progress", "health"}
        rng = random.Random(FUZZ_SEED + 7)
        ctx = zmq.Context()
        try:
            sent = throw_at(ctx, endpoints, None, rng, rounds=150)  # strangers: no token
            token = read_token(ctx, endpoints["control"], run)
            sent += throw_at(ctx, endpoints, token, rng, rounds=150)  # the run's token, then mutated content
        finally:
            ctx.term()
        code = run.wait()
        yield run, code, sent
    finally:
        run.close()


@pytest.mark.slow
def test_a_run_under_random_and_mutated_messages_still_ends_with_every_frame(fuzzed_run):
    run, code, sent = fuzzed_run
    assert sent > 1000
    assert code == 0, run.stderr()
    report = run.report()
    frames = report["frames"]
    assert (frames["in"], frames["processed"], frames["failed"], frames["lost"]) == (LIVE_FRAMES, LIVE_FRAMES, 0, 0)
    assert [r["name"] for r in report["restarts"]] == ["post-0"]  # the kill that made the runner broadcast
    dropped = report["dropped_messages"]
    for process in ("pre-0", "infer-0", "collector"):
        counts = dropped.get(process, {})
        assert any(k.endswith(":token") for k in counts) and any(k.endswith(":schema") for k in counts), dropped
    for process in ("pre-0", "infer-0"):  # a well-formed credit or ack from no consumer of theirs
        assert dropped[process].get("link:stranger"), dropped
    # each kind of drop is logged once per process, then only counted
    lines = [line.split(" ", 2)[2] for line in run.log().splitlines() if "dropped a bad message on" in line]
    keys = [(line.split()[0], line.split("dropped a bad message on ")[1].split(":")[0]) for line in lines]
    assert keys and len(keys) == len(set(keys)), sorted(keys)
    assert any(k[0].startswith("runner[") for k in keys)  # the runner's own sockets drop and log too
    run.assert_clean()


@pytest.mark.slow
def test_the_runners_dropped_messages_are_counted_in_the_report(fuzzed_run):
    run, _, _ = fuzzed_run
    assert any(name.startswith("runner") for name in run.report()["dropped_messages"])


def test_a_heartbeat_from_no_process_of_the_run_does_not_drain_it():
    from types import SimpleNamespace

    from supervisor.run import _on_beat
    from supervisor.signals import Interrupts
    watch = SimpleNamespace(health=Health(timeout_s=5.0), interrupts=Interrupts())
    watch.health.expect("pre-0", 0)
    _on_beat(watch, {"type": HEARTBEAT, "name": "pre-0", "incarnation": 7, "pid": 1, "loop_age_s": 0.0,
                     "position": 0, "signal": "SIGTERM"})  # a replaced incarnation, or no worker at all
    assert watch.interrupts.count == 0
