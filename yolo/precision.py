"""Which floating-point precision the model runs in, chosen once where the options enter.

``fp32`` by default. Half precision means ``fp16`` on CUDA and ``bf16`` on the CPU (fp16 has
no fast CPU kernels; bf16 has fp32's range, so nothing overflows). bf16 is only fast on a CPU
with bf16 instructions (AVX512-BF16 or AMX-BF16); elsewhere PyTorch emulates it, measured about
9x slower than fp32 on an AVX2-only AMD EPYC (Zen 2), so :func:`choose_precision` refuses it
there instead of running a silent slow path.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # torch is imported where a tensor is made: the runner checks precision without it
    import torch

log = logging.getLogger(__name__)

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO_PATH = "/proc/cpuinfo"
EMULATED_BF16_COST = "about 9x slower than fp32, measured on an AVX2-only CPU"


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {list(PRECISIONS)}, got {precision!r}")


def parse_cpu_flags(cpuinfo: str) -> frozenset[str] | None:
    """The ``flags`` of the first processor in a ``/proc/cpuinfo`` text, or None when it has no
    ``flags`` line (not an x86 Linux machine: the flags are unknown)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return None


def read_cpu_flags(cpuinfo_path: str = CPUINFO_PATH) -> frozenset[str] | None:
    """This machine's CPU flags from ``cpuinfo_path``; None where unknown (not Linux, unreadable)."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            return parse_cpu_flags(f.read())
    except OSError:
        return None


def has_native_bf16(flags: Collection[str] | None) -> bool:
    """True when the CPU flags include a bf16 instruction set; unknown flags (None) count as no."""
    return flags is not None and any(flag in flags for flag in NATIVE_BF16_CPU_FLAGS)


def choose_precision(device: torch.device | str, half: bool, *, require_native: bool = True,
                     cpuinfo_path: str = CPUINFO_PATH) -> Precision:
    """The precision for ``half`` on ``device``: ``fp32``, ``fp16`` (CUDA) or ``bf16`` (CPU).

    Args:
        device: where the model runs, ``cpu`` or ``cuda[:N]``.
        half: run in half precision.
        require_native: refuse bf16 on a CPU without bf16 instructions (it would run emulated).
            False only for tests that check bf16 numerics on such a CPU.
        cpuinfo_path: where the CPU flags are read (Linux ``/proc/cpuinfo``).

    Raises:
        ValueError: ``half`` on a CPU without native bf16, the message naming the missing
            instruction sets and the cost of emulation; or a device that is neither CPU nor CUDA.
    """
    kind = _device_type(device)
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device: expected cpu or cuda, got {str(device)!r}")
    if not half:
        return "fp32"
    if kind == "cuda":
        return "fp16"
    if require_native:
        flags = read_cpu_flags(cpuinfo_path)
        if not has_native_bf16(flags):
            raise ValueError(_no_native_bf16_message(flags, cpuinfo_path))
    return "bf16"


def warn_if_emulated(precision: str, device: torch.device | str) -> None:
    """Log a warning when bf16 was asked for directly on a CPU that would emulate it."""
    if precision == "bf16" and _device_type(device) == "cpu" and not has_native_bf16(read_cpu_flags()):
        log.warning("bf16 on a CPU without %s runs emulated, %s", " or ".join(NATIVE_BF16_CPU_FLAGS),
                    EMULATED_BF16_COST)


def input_dtype(precision: str) -> torch.dtype:
    """The dtype of the model's input batch: float16 for fp16 weights; float32 otherwise (bf16
    runs under autocast, which casts at each convolution)."""
    import torch
    check_precision(precision)
    return torch.float16 if precision == "fp16" else torch.float32


def _device_type(device) -> str:
    """``"cuda"`` for ``cuda``, ``cuda:1`` or a torch device of that type; the text before ':' otherwise."""
    return getattr(device, "type", None) or str(device).split(":", 1)[0]


def _no_native_bf16_message(flags: frozenset[str] | None, cpuinfo_path: str) -> str:
    wanted = " or ".join(NATIVE_BF16_CPU_FLAGS)
    found = (f"this CPU's flags ({cpuinfo_path}) have neither" if flags is not None
             else f"this CPU's flags are unknown ({cpuinfo_path} has no 'flags' line or cannot be read)")
    return (f"half precision on the CPU means bfloat16, which needs a CPU with bf16 instructions: "
            f"expected {wanted}, {found}; bf16 would run emulated, {EMULATED_BF16_COST}. "
            f"Run in fp32 (without half), or use a CUDA device for fp16")
