"""Analysis of a run: statistics, the report files, the plots (and, later, sweeps over runs).

Pure Python, numpy and (for the plots only) matplotlib: nothing here imports torch, so the
collector process that writes the run folder need not load it."""
