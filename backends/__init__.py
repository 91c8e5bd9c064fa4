"""Inference backends: what turns a batch of letterboxed frames into candidate rows per frame.
backends/registry.py names them; each backend is one module with a ``load(options)``."""
