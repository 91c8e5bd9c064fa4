"""sweep.png: the fps of every trial in the order run (the search's path, the defaults' level and
the gain threshold drawn across), and the fps of each settings tried, mean and single trials, the
best marked. Drawn with matplotlib's Agg backend into PNG bytes; None without matplotlib."""

from __future__ import annotations

from analysis.plots import figure_png, headless_pyplot
from sweep.search import SweepResult, mean_fps

PURPOSE_COLOURS = {"defaults": "tab:gray", "candidate": "tab:blue", "confirm": "tab:purple", "rematch": "tab:olive",
                   "final check": "tab:cyan"}
BEST_COLOUR = "tab:orange"


def sweep_png(result: SweepResult) -> bytes | None:
    plt = headless_pyplot("sweep.png")
    if plt is None:
        return None
    measured = [t for t in result.trials if t.fps is not None]
    if not measured:
        return None
    fig, (path, per_settings) = plt.subplots(1, 2, figsize=(13, 1.5 + max(4.0, 0.35 * _settings_count(result))),
                                             gridspec_kw={"width_ratios": [1.1, 1.0]})
    try:
        _trial_path(path, result)
        _settings_bars(per_settings, result)
    except BaseException:
        plt.close(fig)
        raise
    return figure_png(plt, fig)


def _settings_count(result: SweepResult) -> int:
    return len({t.settings for t in result.trials if t.fps is not None})


def _trial_path(axes, result: SweepResult) -> None:
    """fps per trial in order, coloured by purpose; the best settings' trials ringed."""
    for purpose, colour in PURPOSE_COLOURS.items():
        trials = [t for t in result.trials if t.purpose == purpose and t.fps is not None]
        if trials:
            axes.scatter([t.index for t in trials], [t.fps for t in trials], color=colour, s=40, label=purpose,
                         zorder=3)
    best_trials = [t for t in result.trials if t.settings == result.best and t.fps is not None]
    if best_trials:
        axes.scatter([t.index for t in best_trials], [t.fps for t in best_trials], s=160, facecolors="none",
                     edgecolors=BEST_COLOUR, linewidths=2, label=f"best: {result.best.label()}", zorder=4)
    candidates = [t for t in result.trials if t.fps is not None and t.purpose == "candidate"]
    for n, t in enumerate(candidates):  # labels staggered up and down: neighbours often share an fps
        axes.annotate(t.settings.change_from(result.defaults) or "defaults", (t.index, t.fps), fontsize="x-small",
                      textcoords="offset points", xytext=(4, 5 if n % 2 == 0 else -11))
    base = mean_fps(result.trials, result.defaults)
    if base:
        axes.axhline(base, color="tab:gray", linestyle="--", label=f"defaults' mean {base:.1f} fps")
    best = mean_fps(result.trials, result.best) if result.best else None
    if best and result.best != result.defaults:
        axes.axhline(best, color=BEST_COLOUR, linestyle="--", label=f"best's mean {best:.1f} fps")
    failed = [t.index for t in result.trials if t.fps is None]
    if failed:
        axes.scatter(failed, [0] * len(failed), marker="x", color="tab:red", label="failed", zorder=3)
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set(xlabel="trial (in the order run)", ylabel="fps (measured window)",
             title=f"{len(result.trials)} trials in {result.elapsed_s:.0f} s of a {result.budget_s:.0f} s budget")
    # below the axes: inside them the legend covered trials
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize="small", frameon=False)


def settings_rows(result: SweepResult) -> list[tuple]:
    """(settings, mean fps, not kept) per settings tried, bottom row first: by mean fps with the
    best on top; "not kept": its mean beats the best's but it was not chosen (a lucky trial that
    did not hold back to back, or a gain under the threshold)."""
    best_mean = mean_fps(result.trials, result.best) if result.best else None
    tried = sorted({t.settings for t in result.trials if t.fps is not None},
                   key=lambda s: (s == result.best, mean_fps(result.trials, s) or 0.0))
    means = [mean_fps(result.trials, s) for s in tried]
    return [(s, m, s != result.best and best_mean is not None and m > best_mean) for s, m in zip(tried, means)]


def _settings_bars(axes, result: SweepResult) -> None:
    """A bar per settings tried (settings as pre/infer x threads/post and batch), its mean fps,
    a dot per trial; the best orange and on top, the defaults grey; settings not kept
    hatched, the best's mean a dashed line across."""
    rows = settings_rows(result)
    tried, means, unconfirmed = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    colours = [BEST_COLOUR if s == result.best else "tab:gray" if s == result.defaults else "tab:blue" for s in tried]
    bars = axes.barh(range(len(tried)), means, color=colours, alpha=0.8)
    for bar, hatched in zip(bars, unconfirmed):
        if hatched:
            bar.set(hatch="//", alpha=0.35)
    best_mean = mean_fps(result.trials, result.best) if result.best else None
    if best_mean:
        axes.axvline(best_mean, color=BEST_COLOUR, linestyle="--", linewidth=1)
    counts = []
    for row, settings in enumerate(tried):
        values = [t.fps for t in result.trials if t.settings == settings and t.fps is not None]
        counts.append(len(values))
        axes.scatter(values, [row] * len(values), color="black", s=12, zorder=3)
        axes.text(max(values), row, f"  {means[row]:.1f}", va="center", fontsize="small")
    labels = [s.label() + (" defaults" if s == result.defaults else "") + (" BEST" if s == result.best else "")
              + (" not kept" if hatched else "") + f" ({n} trial{'s' if n > 1 else ''})"
              for s, n, hatched in zip(tried, counts, unconfirmed)]
    axes.set_yticks(range(len(tried)), labels, fontsize="small")
    axes.set_xlim(0, 1.12 * max(t.fps for t in result.trials if t.fps is not None))
    axes.set(xlabel="mean fps over the settings' trials (dots: single trials)",
             title=f"settings (pre / infer x threads / post, batch)\na change is kept when it gains "
                   f"{100 * result.threshold:.0f} % over the best so far")
