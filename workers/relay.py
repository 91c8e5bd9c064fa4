"""A pass-through stage after postprocess (a tracker, a filter, an exporter): each process takes
finished frames (a result: detections, names, timestamps) from the stage before it, hands each to
the stage's function, and sends what it returns on, to the next stage or the collector.

A plugin makes one with a table entry and a module whose ``run(args)`` calls :func:`run_relay`::

    register_stage(StageKind("track", "tracker", "my_plugin", uses_torch=False, count=1), after="post")

    def run(args):
        run_relay(args, my_tracker.update)  # takes and returns a result dict

Credit, resends when a process dies, poisoned frames, the report row and the trace span come
with it, as for the built-in stages."""

from __future__ import annotations

import time
from collections.abc import Callable

from analysis.samples import Samples
from process.failure_log import FailureLog
from process.faults import TestFaults
from process.stage_loop import StageProcess, run_loop
from sharedmem.in_hand import InHand
from topology.stages import kind_of, role_of
from wire.links import SlotReturns
from wire.messages import RESULT, SCHEMAS, Failed, check_fields
from wire.wiring import StageArgs
from workers.onward import FrameStage

LINK_FIELDS = ("type", "src")  # what the link put on the result


class Relay(FrameStage):
    def __init__(self, process: StageProcess, on_result: Callable[[dict], dict]):
        args = process.args
        super().__init__(process, credit=args.config.prefetch)
        self.on_result = on_result
        self.role = role_of(args.name)
        self.start_key, self.end_key = kind_of(self.role).frame_times[0], kind_of(self.role).frame_times[-1]
        self.returns = process.own(SlotReturns(process.ctx, args))
        self.failures = process.own(FailureLog(process.log))
        self.faults = TestFaults.for_role(self.role)
        self.in_hand = process.own(InHand(args.run_tag, args.name))
        self.step_ms = Samples()
        self.frames = 0
        self.frames_in.start()

    def receive(self, socket) -> None:
        taken = self.take(socket, _result_of)
        if taken is None:
            return
        msg, result = taken
        control, clock = self.process.control, self.process.clock
        measured = result["id"] >= self.args.config.warmup and not result["cold"]
        with clock.busy() as spent:
            self.in_hand.hold(result["id"])
            t_start = time.perf_counter()
            try:
                if control.poison.get(result["id"]):
                    raise RuntimeError(control.poison[result["id"]])
                self.faults.on_frames([result["name"]])
                done = self.on_result(result)
                done["t"] = {**done["t"], self.start_key: t_start, self.end_key: time.perf_counter()}
                done["workers"] = {**(done.get("workers") or {}), self.role: self.args.name}
                self.onward.put(done, msg.arrays)
            except Exception as exc:  # one bad frame must not take the stage down
                poisoned = bool(control.poison.get(result["id"]))
                self.failures.failed("frame %d failed in %s", result["id"], self.role, exc_info=not poisoned)
                self.fail(result, str(exc) if poisoned else repr(exc))
            self.in_hand.hold()
        if measured:
            clock.add_frames(*spent, frames=1)
            self.step_ms.add(spent[0] * 1e3)
        self.frames += 1

    def fail(self, result: dict, reason: str) -> None:
        """The frame is failed here; a video frame's slot, kept for the collector, is given back."""
        self.onward.failed(Failed(result["id"], result["name"], self.role, self.args.name, reason, result.get("cycle"),
                                  result.get("video")).to_message())
        if result.get("px"):
            self.returns.release(result["id"], result.get("pre"), result["px"])

    def finish(self) -> None:
        onward = self.onward
        onward.flush()
        self.process.tell_collector(self.process.summary(
            self.role, self.frames, bytes_in=self.frames_in.bytes_received, bytes_out=onward.bytes_out,
            messages_in=self.frames_in.frames_received, messages_out=onward.messages_out, link=onward.link_label,
            substages_ms={"step": self.step_ms.to_dict()}, **onward.held()))


def _result_of(header: dict) -> dict:
    """The result a frame on the link carries (ProtocolError if it is not one)."""
    return check_fields({k: v for k, v in header.items() if k not in LINK_FIELDS}, SCHEMAS[RESULT], "frame")


def run_relay(args: StageArgs, on_result: Callable[[dict], dict], use_torch: bool = False) -> None:
    process = StageProcess(args, use_torch=use_torch)
    run_loop(process, Relay(process, on_result))
