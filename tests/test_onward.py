"""The last frame stage's results for the collector: gathered into one message per batch or per
RESULTS_HOLD_S (each message costs the collector its wake-ups), with every frame's credit given
back as it is finished, and its ack only once its batch went."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

import workers.onward as onward
from workers.onward import RESULTS_BATCH, RESULTS_HOLD_BYTES, RESULTS_HOLD_S, SLOT_HOLD_S, Onward


class FakeUpstream:
    """What the stage tells its producers, in order."""

    def __init__(self):
        self.told: list[tuple] = []
        self.sizes: dict[int, int] = {}  # bytes of each frame's message, where a test says

    def taken(self, frame_id: int) -> int:
        self.told.append(("taken", frame_id))
        return self.sizes.get(frame_id, 500)

    def ack_all(self, frames) -> None:
        self.told.append(("acks", [frame_id for frame_id, _ in frames]))

    def ack(self, frame_id: int, release: bool = False) -> None:
        self.told.append(("acks", [frame_id]))


def result(frame_id: int) -> dict:
    return {"type": "result", "id": frame_id, "name": f"{frame_id}.jpg", "t": {}, "detections": [], "workers": {},
            "batch": 1, "image_saved": False, "cold": False, "predictions": []}


@pytest.fixture()
def stage(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(onward.time, "perf_counter", lambda: now[0])
    sent: list[dict] = []
    monkeypatch.setattr(onward.SentResults, "send", lambda self, header, frames=1: sent.append(header) or 100)
    process = SimpleNamespace(args=SimpleNamespace(name="post-0", wire=SimpleNamespace(token=b"t" * 16)),
                              log=logging.getLogger("test"), to_collector=None)
    frames_in = FakeUpstream()
    return SimpleNamespace(onward=Onward(process, frames_in), told=frames_in.told, sent=sent, now=now,
                           sizes=frames_in.sizes)


def test_results_wait_for_their_batch_while_their_credit_goes_back_at_once(stage):
    out = stage.onward
    for frame_id in range(3):
        out.put(result(frame_id))
    assert stage.told == [("taken", 0), ("taken", 1), ("taken", 2)] and stage.sent == []
    assert out.poll_timeout_ms(1000.0) == pytest.approx(RESULTS_HOLD_S * 1e3 + 1)
    assert out.poll_timeout_ms(20.0) == 20.0
    stage.now[0] += RESULTS_HOLD_S / 2
    assert not out.step() and stage.sent == []  # not due yet
    stage.now[0] += RESULTS_HOLD_S * 0.6
    out.step()
    assert [[item["id"] for item in m["items"]] for m in stage.sent] == [[0, 1, 2]]
    assert stage.told[-1] == ("acks", [0, 1, 2]) and out.messages_out == 1
    assert out.poll_timeout_ms(1000.0) == 1000.0  # nothing pending


def test_a_full_batch_goes_at_the_next_step_and_the_rest_when_the_stage_finishes(stage):
    """A full batch goes from the loop's next step, not from put(): a send that fails there must
    not fail the frame being put, whose result is already in the batch."""
    out = stage.onward
    for frame_id in range(RESULTS_BATCH - 1):
        out.put(result(frame_id))
    out.step()
    assert stage.sent == []
    for frame_id in range(RESULTS_BATCH - 1, 2 * RESULTS_BATCH + 5):  # more than a batch between two steps
        out.put(result(frame_id))
    assert stage.sent == []
    out.step()
    assert [len(m["items"]) for m in stage.sent] == [RESULTS_BATCH, RESULTS_BATCH, 5]  # at most a batch a message
    for frame_id in range(200, 203):
        out.put(result(frame_id))
    out.flush_due()  # a lull does not send a batch before it is due
    assert len(stage.sent) == 3
    assert out.finished()  # the end of the stream: what is left goes now
    assert [len(m["items"]) for m in stage.sent] == [RESULTS_BATCH, RESULTS_BATCH, 5, 3]
    acked = [i for kind, ids in stage.told if kind == "acks" for i in ids]
    assert acked == [*range(2 * RESULTS_BATCH + 5), 200, 201, 202]


def test_frames_whose_producers_keep_large_messages_go_sooner(stage):
    """An original that travelled inline stays with its producer until the ack: the batch goes
    once such frames add up to RESULTS_HOLD_BYTES, before it is full or due."""
    stage.sizes.update({0: 1000, 1: RESULTS_HOLD_BYTES})
    out = stage.onward
    out.put(result(0))
    out.step()
    assert stage.sent == []
    out.put(result(1))
    out.step()
    assert [[item["id"] for item in m["items"]] for m in stage.sent] == [[0, 1]]


def test_a_failure_goes_to_the_collector_at_once(stage):
    out = stage.onward
    out.put(result(0))
    out.failed({"type": "failed", "id": 1, "name": "1.jpg", "stage": "post", "reason": "bad"})
    assert [m["type"] for m in stage.sent] == ["failed"] and stage.told[-1] == ("acks", [1])


def test_a_result_that_holds_a_slot_does_not_wait_long(stage):
    """A kept video frame's pixels go to the collector in a slot of the preprocess worker's small
    ring: its batch goes after SLOT_HOLD_S, not RESULTS_HOLD_S."""
    out = stage.onward
    out.put(result(0))
    out.put({**result(1), "px": {"orig": {"seg": "s", "slot": 0}}})
    assert out.poll_timeout_ms(1000.0) == pytest.approx(SLOT_HOLD_S * 1e3 + 1)
    stage.now[0] += SLOT_HOLD_S * 1.1
    out.step()
    assert [[item["id"] for item in m["items"]] for m in stage.sent] == [[0, 1]]
