"""Faults a test asks a stage to suffer, read once from the environment (nothing outside tests):
each frame costs extra CPU, or a frame with a given name kills the process as a decoder crash
would, or its start-up takes longer. A stage calls :meth:`TestFaults.on_frames` once per unit of
work (and inference :meth:`TestFaults.delay_start` before loading its model) and knows nothing else."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

TEST_SLOW_ENV = "YOLO_PIPELINE_TEST_SLOW"  # "post:30" makes each post frame burn 30 CPU-ms ("pre:5,post:30")
TEST_START_ENV = "YOLO_PIPELINE_TEST_START_S"  # "infer:8": the stage starts 8 s later (a model that loads slowly)
TEST_CRASH_ENV = "YOLO_PIPELINE_TEST_CRASH"  # "text" (pre), "infer:text", "post:text": die on frames so named
TEST_OOM_ENV = "YOLO_PIPELINE_TEST_OOM"  # "2": inference's device runs out of memory on batches of more than 2 frames
CRASH_EXIT_CODE = 70


@dataclass(frozen=True)
class TestFaults:
    slow_ms: float = 0.0  # CPU-ms burnt per frame
    crash_on: str = ""  # die on a frame whose name holds this text
    start_delay_s: float = 0.0  # seconds of start-up added before the stage's first heartbeat
    memory_frames: int = -1  # the most frames a batch may hold before the device runs out of memory; -1: no limit

    @classmethod
    def for_role(cls, role: str) -> TestFaults:
        return cls(slow_ms=_number_for(os.environ.get(TEST_SLOW_ENV, ""), role),
                   crash_on=_crash_text(os.environ.get(TEST_CRASH_ENV, ""), role),
                   start_delay_s=_number_for(os.environ.get(TEST_START_ENV, ""), role),
                   memory_frames=int(os.environ.get(TEST_OOM_ENV, "-1")) if role == "infer" else -1)

    def on_batch(self, frames: int) -> None:
        """A batch about to run: the device's out-of-memory error if it holds more frames than the test allows."""
        if 0 <= self.memory_frames < frames:
            import torch  # only inference asks, and it has torch
            raise torch.OutOfMemoryError(f"Tried to allocate a batch of {frames} frames (test limit "
                                         f"{self.memory_frames})")

    def delay_start(self) -> None:
        """A start-up as slow as the test asked (a sleep: loading a model mostly waits on disk)."""
        if self.start_delay_s:
            time.sleep(self.start_delay_s)

    def on_decode(self, names: list[str]) -> None:
        """Frames about to be decoded in one call (the device data path's inference): die if one
        is the named frame, as a decoder that crashes on a file would."""
        if self.crash_on and any(self.crash_on in name for name in names):
            os._exit(CRASH_EXIT_CODE)

    def on_frames(self, names: list[str]) -> None:
        """One unit of work on these frames: die if one is the named frame, burn the CPU asked for."""
        if self.crash_on and any(self.crash_on in name for name in names):
            os._exit(CRASH_EXIT_CODE)
        if self.slow_ms:
            burn_cpu(self.slow_ms * len(names))


def _crash_text(spec: str, role: str) -> str:
    for part in spec.split(","):
        stage, _, text = part.partition(":") if ":" in part else ("pre", "", part)
        if stage.strip() == role and text:
            return text
    return ""


def _number_for(spec: str, role: str) -> float:
    """The number given to ``role`` in a spec such as "pre:5,post:30"; 0 if none."""
    for part in spec.split(","):
        stage, _, ms = part.partition(":")
        if stage.strip() == role and ms.strip():
            return float(ms)
    return 0.0


def burn_cpu(ms: float) -> None:
    """Spin on the CPU (not sleep): a slow stage in a test must cost CPU like a real one."""
    end = time.thread_time() + ms / 1e3
    while time.thread_time() < end:
        pass
