"""The pipeline's shape, declared once: which stage kinds exist, what each runs, binds and feeds.
Imports nothing of the project, so every package may read it."""
