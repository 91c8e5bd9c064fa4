"""yolo.precision: the CPU's bf16 capability read from its flags, and the precision chosen for
(device, half), refusing an emulated bf16 with a message that says why and what it costs."""

from __future__ import annotations

import pytest
import torch

from yolo.precision import (NATIVE_BF16_CPU_FLAGS, choose_precision, has_native_bf16, input_dtype, parse_cpu_flags,
                            read_cpu_flags)

ZEN2_FLAGS = "fpu vme sse sse2 avx f16c avx2 sha_ni clzero"
SAPPHIRE_RAPIDS_FLAGS = "fpu sse2 avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8"


def _cpuinfo(tmp_path, flags: str | None, name: str = "cpuinfo") -> str:
    """A two-processor /proc/cpuinfo with the given flags (no 'flags' line when None)."""
    flag_line = f"flags\t\t: {flags}\n" if flags is not None else "Features\t: fp asimd evtstrm\n"
    block = f"processor\t: {{i}}\nvendor_id\t: SomeVendor\n{flag_line}bogomips\t: 4491.54\n\n"
    path = tmp_path / name
    path.write_text(block.format(i=0) + block.format(i=1))
    return str(path)


@pytest.mark.parametrize("flags, native", [
    (ZEN2_FLAGS, False),
    (SAPPHIRE_RAPIDS_FLAGS, True),
    ("fpu avx512f avx512_bf16", True),  # Cooper Lake / Zen 4: AVX512-BF16 without AMX
    ("fpu amx_bf16 amx_tile", True),
    ("fpu avx512f avx512_bf16x", False),  # whole flags only, not prefixes
])
def test_native_bf16_from_flags(tmp_path, flags, native):
    assert has_native_bf16(read_cpu_flags(_cpuinfo(tmp_path, flags))) is native


def test_unknown_flags_are_not_native(tmp_path):
    assert parse_cpu_flags(open(_cpuinfo(tmp_path, None)).read()) is None  # e.g. an ARM cpuinfo
    assert read_cpu_flags(str(tmp_path / "missing")) is None
    assert not has_native_bf16(None)


@pytest.mark.parametrize("flags", [ZEN2_FLAGS, None], ids=["no-bf16-flags", "unknown-flags"])
def test_half_on_cpu_without_native_bf16_is_refused(tmp_path, flags):
    path = _cpuinfo(tmp_path, flags)
    with pytest.raises(ValueError) as exc:
        choose_precision("cpu", True, cpuinfo_path=path)
    message = str(exc.value)
    assert all(name in message for name in NATIVE_BF16_CPU_FLAGS)
    assert "emulated" in message and "9x slower" in message
    assert path in message


def test_half_on_cpu_with_native_bf16_is_bf16(tmp_path):
    assert choose_precision("cpu", True, cpuinfo_path=_cpuinfo(tmp_path, SAPPHIRE_RAPIDS_FLAGS)) == "bf16"


def test_escape_hatch_allows_emulated_bf16(tmp_path):
    assert choose_precision("cpu", True, require_native=False, cpuinfo_path=_cpuinfo(tmp_path, ZEN2_FLAGS)) == "bf16"


@pytest.mark.parametrize("device, half, expected", [
    ("cpu", False, "fp32"), ("cuda", False, "fp32"), ("cuda:1", True, "fp16"), (torch.device("cuda", 0), True, "fp16"),
])
def test_precision_per_device(tmp_path, device, half, expected):
    # Neither needs a CUDA device or bf16 flags: CUDA half is fp16 whatever the CPU has.
    assert choose_precision(device, half, cpuinfo_path=_cpuinfo(tmp_path, ZEN2_FLAGS)) == expected


def test_other_device_is_refused():
    with pytest.raises(ValueError, match="expected cpu or cuda, got 'meta'"):
        choose_precision("meta", True)


def test_input_dtype():
    assert [input_dtype(p) for p in ("fp32", "bf16", "fp16")] == [torch.float32, torch.float32, torch.float16]
    with pytest.raises(ValueError, match="got 'int8'"):
        input_dtype("int8")
