"""What one trial of the tuning sweep measured: its run's summary, read back, from which the
search (sweep.search) judges the trial and the moves (sweep.moves) choose the next."""

from __future__ import annotations

from dataclasses import dataclass, field

from topology.stages import frame_roles


@dataclass(frozen=True)
class Measurement:
    """What one trial's run reported (its summary), or why it measured nothing."""

    fps: float | None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    cpu_ms_per_frame: float | None = None
    cpu_saturation: float | None = None
    bound_fps: float | None = None
    bound_kind: str | None = None
    bottleneck: str | None = None
    limit: str | None = None
    hint: str = ""
    stable: bool = False
    stable_reason: str | None = None
    utilisation: dict[str, float] = field(default_factory=dict)
    exit_code: int = 0
    error: str | None = None
    run_dir: str | None = None

    @classmethod
    def from_summary(cls, summary: dict | None, exit_code: int, run_dir: str | None,
                     error: str | None = None) -> Measurement:
        if not summary:
            return cls(fps=None, exit_code=exit_code, error=error or "the run wrote no summary", run_dir=run_dir)
        stages = summary.get("stages") or {}
        return cls(fps=summary.get("fps"), latency_p50_ms=summary.get("latency_p50_ms"),
                   latency_p95_ms=summary.get("latency_p95_ms"), cpu_ms_per_frame=summary.get("cpu_ms_per_frame"),
                   cpu_saturation=summary.get("cpu_saturation"), bound_fps=summary.get("bound_fps"),
                   bound_kind=summary.get("bound_kind"), bottleneck=summary.get("bottleneck"),
                   limit=summary.get("limit"), hint=summary.get("hint") or "", stable=bool(summary.get("stable")),
                   stable_reason=summary.get("stable_reason"),
                   utilisation={role: stages[role]["utilisation"] for role in frame_roles() if role in stages},
                   exit_code=exit_code, error=error if exit_code else None, run_dir=run_dir)

    @property
    def ok(self) -> bool:
        return self.fps is not None and self.exit_code == 0
