"""The tuning sweep's backend move: --backend openvino tried where it is ready (installed, its
model converted: ``backends``) and inference runs on the CPU, against test_sweep's fake pipeline
whose inference is faster there."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from sweep.search import Machine, Measurement, Settings, Sweep, propose
from sweep.output import sweep_table
from tests.test_sweep import DEFAULTS_2_CORES, FakeClock, FakePipeline


@dataclass
class OpenVinoFaster(FakePipeline):
    """As FakePipeline; on --backend openvino inference takes ``openvino_ratio`` of its torch ms."""

    openvino_ratio: float = 0.7

    def fps(self, s: Settings) -> tuple[float, dict, float, float]:
        if s.backend != "openvino":
            return super().fps(s)
        on_torch = {f.name: getattr(self, f.name) for f in dataclasses.fields(FakePipeline)}
        return FakePipeline(**{**on_torch, "infer_ms": self.infer_ms * self.openvino_ratio}).fps(s)


def test_the_sweep_moves_to_openvino_where_it_is_installed_and_pays():
    pipeline = OpenVinoFaster()
    result = Sweep(pipeline, Machine(cores=2), 600.0, 8.0, clock=pipeline.clock, backends=("openvino",)).run(DEFAULTS_2_CORES)
    assert result.best.backend == "openvino" and result.best.label().endswith(" openvino")
    first = next(t for t in result.trials if t.settings.backend == "openvino")
    assert first.reason.startswith("backend torch->openvino: cores saturated: OpenVINO's forward")
    assert "--backend openvino" in shlex.join(result.best.flags()) and "openvino" in sweep_table(result)


def test_no_openvino_move_where_it_is_not_ready_or_inference_is_on_a_gpu():
    not_installed = Sweep(OpenVinoFaster(), Machine(cores=2), 600.0, 8.0, clock=FakeClock())
    assert all(t.settings.backend == "torch" for t in not_installed.run(DEFAULTS_2_CORES).trials)
    analysis = Measurement(fps=200.0, bottleneck="infer", limit="stage", cpu_saturation=0.3,
                           utilisation={"pre": 0.5, "infer": 0.95, "post": 0.2})
    on_gpu = propose(DEFAULTS_2_CORES, analysis, Machine(cores=16, gpus=1), backends=("openvino",))
    assert on_gpu and all(m.settings.backend == "torch" for m in on_gpu)  # OpenVINO runs on the CPU here
