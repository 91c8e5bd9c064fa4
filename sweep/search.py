"""The tuning sweep's search: short trials over the worker counts, inference threads and batch
size, each step chosen from the last run's analysis (its bottleneck and whether the cores are
saturated), not from a grid.

Start from the settings as given (the defaults trial). From the best settings so far (the
incumbent), the analysis of its latest trial names the moves worth measuring:

- cores saturated (``limit == "cores"``): never more processes or threads. Fewer processes
  where a stage has more workers than cores, a larger batch (fewer forwards and messages per
  frame), fewer workers for stages that idle, one inference process traded for a thread;
- one stage busy with cores to spare (``"stage"``): grow that stage (workers; on CPU inference
  also threads and then batch; on a GPU batch first);
- no stage busy (``"flow"``): grow the busiest stage, or halve a batch that waits to fill.

A candidate whose fps beats the incumbent's by ``GAIN_THRESHOLD`` (5 %, as Triton's
model_analyzer) is measured again right after the incumbent is, since these machines drift by
tens of percent between runs; it replaces the incumbent when the means over each one's trials
still differ by the threshold and the back-to-back pair agrees. A move that paid is tried
again first (grow a setting until the gain falls below the threshold). When no unmeasured move
is left, budget left over goes to rematches: settings whose mean fps is within 10 % of the
incumbent's are measured again right after it (at most four trials each), and one that now
beats it by the threshold in the mean and in most back-to-back pairs takes over (the search
then goes on from it). The search stops when nothing is left to measure or the next trial would
not fit in the budget. The budget of every step keeps room for a final check: the defaults and
the best measured once more, back to back, before the best is named. The best is the incumbent
unless its mean fps fell below the defaults', or it was the slower of the two in that final
check (a winner from noise); so it is never slower than the defaults as this sweep measured
them. A sweep none of whose trials was stable says so (``SweepResult.stable_trials``)."""

from __future__ import annotations

import logging
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from supervisor import exit_codes
from sweep.measurement import Measurement  # noqa: F401 (re-exported)
from sweep.moves import SWEPT, Machine, Move, Settings, propose  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

GAIN_THRESHOLD = 0.05  # a move must raise fps by this fraction to be kept
REMATCH_WITHIN = 0.10  # with no move left, settings this close to the best's fps are measured again
MAX_TRIALS_PER_SETTINGS = 4  # ... until they have had this many trials
FIRST_TRIAL_EXTRA_S = 8.0  # the first trial also imports torch in the fork server
TRIAL_OVERHEAD_S = 5.0  # process start-up and the final report of a trial, before any was timed
WRAP_UP_S = 2.0  # kept free at the end of the budget: sweep.csv, sweep.json, sweep.png
FINAL_CHECK_TRIALS = 2  # the defaults and the best once more, back to back: budgeted before any other step


@dataclass
class Trial:
    index: int  # 1-based, in the order run
    settings: Settings
    purpose: str  # defaults | candidate | confirm | rematch | final check
    reason: str  # why it was run
    measurement: Measurement
    cost_s: float  # wall seconds the trial took, start-up and report included
    verdict: str = ""  # what the search concluded from it

    @property
    def fps(self) -> float | None:
        return self.measurement.fps if self.measurement.ok else None


def mean_fps(trials: list[Trial], settings: Settings) -> float | None:
    """Mean fps over the trials of ``settings`` that measured one."""
    values = [t.fps for t in trials if t.settings == settings and t.fps is not None]
    return statistics.fmean(values) if values else None


@dataclass
class SweepResult:
    trials: list[Trial]
    defaults: Settings
    best: Settings | None  # None: the defaults trial measured nothing
    stopped: str  # why the search ended
    elapsed_s: float
    budget_s: float
    threshold: float = GAIN_THRESHOLD
    interrupted: int = 0  # the exit code of an interrupt (130, 143, 129) that ended the sweep; 0 when none
    final_ratio: float | None = None  # fps of the incumbent / the defaults' in the final check; None: none ran
    unconfirmed: Settings | None = None  # the incumbent the final check did not confirm (best fell back)

    @property
    def stable_trials(self) -> int:
        return sum(1 for t in self.trials if t.measurement.stable)

    @property
    def best_fps(self) -> float | None:
        return mean_fps(self.trials, self.best) if self.best else None

    @property
    def defaults_fps(self) -> float | None:
        return mean_fps(self.trials, self.defaults)

    @property
    def gain(self) -> float | None:
        best, base = self.best_fps, self.defaults_fps
        return best / base - 1 if best and base else None

    def latest(self, settings: Settings) -> Trial | None:
        return next((t for t in reversed(self.trials) if t.settings == settings and t.fps is not None), None)


class SweepInterrupted(Exception):
    """Raised by a trial function when the user interrupted the trial: the sweep ends there."""

    def __init__(self, reason: str, exit_code: int):
        super().__init__(reason)
        self.exit_code = exit_code


MeasureFn = Callable[[Settings, int], Measurement]  # (settings, trial index) -> what the run reported


class Sweep:
    """The search (see the module's docstring). ``measure`` runs one trial; ``clock`` is wall
    seconds (a fake one in tests); ``trial_s`` is each trial's time-box, used to estimate the
    cost of a trial before one has been timed; ``backends`` are the backends other than the
    default that trials may move to here (see ``sweep.moves.propose``)."""

    def __init__(self, measure: MeasureFn, machine: Machine, budget_s: float, trial_s: float,
                 threshold: float = GAIN_THRESHOLD, clock: Callable[[], float] = time.perf_counter,
                 on_trial: Callable[[Trial], None] | None = None, started_s: float | None = None,
                 backends: tuple[str, ...] = ()):
        if budget_s <= 0:
            raise ValueError(f"sweep: expected a budget > 0 s, got {budget_s}")
        if threshold <= 0:
            raise ValueError(f"sweep: expected a gain threshold > 0, got {threshold}")
        self.measure, self.machine, self.budget_s, self.trial_s = measure, machine, budget_s, trial_s
        self.backends = backends
        self.threshold, self.clock, self.on_trial = threshold, clock, on_trial or (lambda trial: None)
        self.trials: list[Trial] = []
        self.incumbent: Settings | None = None
        self.pair_ratios: list[tuple[Settings, Settings, float]] = []  # (a, b, fps a / fps b) back to back
        self.started_s = clock() if started_s is None else started_s  # the budget runs from here

    # -- budget ---------------------------------------------------------------------------------
    def elapsed_s(self) -> float:
        return self.clock() - self.started_s

    def trial_cost_estimate_s(self) -> float:
        """The longest of the last three trials (the first one also imported torch: only its
        own estimate when it is the only one timed)."""
        timed = [t.cost_s for t in self.trials[1:]][-3:] or [t.cost_s for t in self.trials]
        return max(timed) if timed else self.trial_s + TRIAL_OVERHEAD_S + FIRST_TRIAL_EXTRA_S

    def fits(self, trials: int, final_check: bool = True) -> bool:
        """Whether ``trials`` more fit in the budget, with the final check's trials kept free
        (``final_check=False`` when they are what is asked for)."""
        reserved = FINAL_CHECK_TRIALS if final_check else 0
        return self.elapsed_s() + (trials + reserved) * self.trial_cost_estimate_s() + WRAP_UP_S <= self.budget_s

    # -- trials ---------------------------------------------------------------------------------
    def run_trial(self, settings: Settings, purpose: str, reason: str) -> Trial:
        index = len(self.trials) + 1
        started = self.clock()
        measurement = self.measure(settings, index)
        trial = Trial(index, settings, purpose, reason, measurement, self.clock() - started)
        if not measurement.ok:
            trial.verdict = f"failed: {measurement.error or 'no fps measured'}"
        self.trials.append(trial)
        return trial

    def report(self, trial: Trial) -> None:
        """Tell the caller about a finished trial, its verdict set."""
        self.on_trial(trial)

    def measured(self) -> set[Settings]:
        return {t.settings for t in self.trials}

    # -- the search -----------------------------------------------------------------------------
    def run(self, defaults: Settings) -> SweepResult:
        """Search from ``defaults``; an interrupted trial ends the search with what was measured."""
        self.incumbent = defaults
        try:
            stopped = self._search(defaults)
        except SweepInterrupted as stop:
            return self._result(defaults, self._best(defaults), f"interrupted: {stop}", interrupted=stop.exit_code)
        except KeyboardInterrupt:  # Ctrl-C between two trials, when no run holds the signal
            return self._result(defaults, self._best(defaults), "interrupted by Ctrl-C",
                                interrupted=exit_codes.INTERRUPTED)
        if stopped is None:
            return self._result(defaults, None, f"the defaults trial measured nothing ({self.trials[0].verdict})")
        final_ratio = self._final_check(defaults, self.incumbent) if self.incumbent != defaults else None
        best = self._best(defaults)
        unconfirmed = None
        if best != defaults and final_ratio is not None and final_ratio <= 1.0:
            best, unconfirmed = defaults, self.incumbent  # slower than the defaults when measured beside them
        result = self._result(defaults, best, stopped)
        result.final_ratio, result.unconfirmed = final_ratio, unconfirmed
        return result

    def _search(self, defaults: Settings) -> str | None:
        """Why the search stopped; None when the defaults trial measured nothing."""
        first = self.run_trial(defaults, "defaults", "the settings as given")
        if first.fps is None:
            self.report(first)
            return None
        first.verdict = "baseline"
        self.report(first)
        repeat = None
        while True:
            analysis = self._latest(self.incumbent).measurement
            moves = [mv for mv in propose(self.incumbent, analysis, self.machine, repeat, self.backends)
                     if mv.settings not in self.measured()]
            if moves:
                if not self.fits(1):
                    return "budget: the next trial would not fit"
                accepted, stop = self._try(self.incumbent, moves[0])
                if accepted:
                    self.incumbent, repeat = moves[0].settings, moves[0].key
                if stop:
                    return stop
                continue
            rival = self._rival()
            if rival is None:
                return "nothing left to measure: every move the analysis names was tried, close rivals rematched"
            if not self.fits(2):
                return "budget: no room for another rematch"
            change = rival.change_from(self.incumbent)
            if self._back_to_back(rival, "rematch", "the incumbent again, beside a close rival",
                                  f"a close rival again ({change})"):
                self.incumbent, repeat = rival, None

    def _best(self, defaults: Settings) -> Settings | None:
        """The incumbent unless its mean fps fell below the defaults' (then the defaults)."""
        base = mean_fps(self.trials, defaults)
        if base is None:
            return None
        return self.incumbent if (mean_fps(self.trials, self.incumbent) or 0.0) >= base else defaults

    def _try(self, incumbent: Settings, move: Move) -> tuple[bool, str]:
        """Measure ``move``; confirm an apparent gain. Returns (accepted, why the search must stop or "")."""
        candidate = self.run_trial(move.settings, "candidate", f"{move.settings.change_from(incumbent)}: {move.reason}")
        if candidate.fps is None:
            self.report(candidate)
            return False, ""
        base = mean_fps(self.trials, incumbent)
        gain = candidate.fps / base - 1
        if gain < self.threshold:
            candidate.verdict = f"rejected: {100 * gain:+.1f} % (< +{100 * self.threshold:.0f} %)"
            self.report(candidate)
            return False, ""
        if not self.fits(2):
            candidate.verdict = f"unconfirmed: {100 * gain:+.1f} %, no budget left to measure it again"
            self.report(candidate)
            return False, "budget: no room to confirm the last gain"
        candidate.verdict = f"{100 * gain:+.1f} %: measuring both again"
        self.report(candidate)
        return self._back_to_back(move.settings, "confirm", "the incumbent again, just before the candidate",
                                  "the candidate again, just after the incumbent"), ""

    def _back_to_back(self, rival: Settings, purpose: str, incumbent_reason: str, rival_reason: str) -> bool:
        """Measure the incumbent, then ``rival``; whether the rival takes over: its mean fps over
        all its trials beats the incumbent's by the threshold, and it was the faster in most of
        their back-to-back pairs (the median of the pairs' ratios is above 1)."""
        base = self.run_trial(self.incumbent, purpose, incumbent_reason)
        if base.fps is not None:
            base.verdict = "the incumbent re-measured"
        self.report(base)
        again = self.run_trial(rival, purpose, rival_reason)
        if base.fps is None or again.fps is None:
            self.report(again)
            return False
        self.pair_ratios.append((rival, self.incumbent, again.fps / base.fps))
        gain = (mean_fps(self.trials, rival) or 0.0) / mean_fps(self.trials, self.incumbent) - 1
        pairs = self.paired_ratios(rival, self.incumbent)
        accepted = gain >= self.threshold and statistics.median(pairs) > 1
        again.verdict = (f"{'accepted' if accepted else 'not confirmed'}: {100 * gain:+.1f} % over all trials, "
                         f"{100 * (again.fps / base.fps - 1):+.1f} % back to back"
                         + (f" (median of {len(pairs)} pairs {100 * (statistics.median(pairs) - 1):+.1f} %)"
                            if len(pairs) > 1 else ""))
        self.report(again)
        return accepted

    def paired_ratios(self, a: Settings, b: Settings) -> list[float]:
        """fps of ``a`` / fps of ``b`` in each back-to-back pair of the two."""
        return [r if (x, y) == (a, b) else 1 / r for x, y, r in self.pair_ratios if {x, y} == {a, b}]

    def _rival(self) -> Settings | None:
        """The measured settings most worth a rematch with the incumbent: the fastest whose mean
        fps is within REMATCH_WITHIN of the incumbent's and who has had fewer than
        MAX_TRIALS_PER_SETTINGS trials; None when there is none."""
        best = mean_fps(self.trials, self.incumbent) or 0.0
        counts = Counter(t.settings for t in self.trials if t.fps is not None)
        rivals = [(mean_fps(self.trials, s), s) for s in counts
                  if s != self.incumbent and counts[s] < MAX_TRIALS_PER_SETTINGS]
        rivals = [(fps, s) for fps, s in rivals if fps >= best * (1 - REMATCH_WITHIN)]
        return max(rivals)[1] if rivals else None

    def _final_check(self, defaults: Settings, best: Settings) -> float | None:
        """Measure the defaults, then ``best``, back to back; fps of best / defaults, or None when
        either measured nothing or the budget was spent after all (a trial took longer than the
        estimate)."""
        if not self.fits(FINAL_CHECK_TRIALS, final_check=False):
            return None
        fps = []
        for settings, what in ((defaults, "the defaults"), (best, "the best")):
            trial = self.run_trial(settings, "final check", f"{what} once more, back to back")
            if trial.fps is not None:
                trial.verdict = "re-measured"
            fps.append(trial.fps)
            if settings == best and None not in fps:
                ratio = fps[1] / fps[0]
                trial.verdict = (f"{100 * (ratio - 1):+.1f} % over the defaults back to back: "
                                 + ("confirmed" if ratio > 1 else "NOT confirmed, the defaults stay best"))
            self.report(trial)
        return fps[1] / fps[0] if None not in fps else None

    def _latest(self, settings: Settings) -> Trial:
        return next(t for t in reversed(self.trials) if t.settings == settings and t.fps is not None)

    def _result(self, defaults: Settings, best: Settings | None, stopped: str, interrupted: int = 0) -> SweepResult:
        return SweepResult(list(self.trials), defaults, best, stopped, self.elapsed_s(), self.budget_s, self.threshold,
                           interrupted)
