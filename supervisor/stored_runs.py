"""Run folders in an object store (``--results s3://bucket/prefix``): the checks before the run,
the run's name, and its upload at the end.

A store has no folders to make and no atomic ``mkdir``: a run folder ``RESULTS/NAME`` is taken
when ``RESULTS/NAME/report.json`` exists (uploaded last, so a folder without it is a run that did
not finish). The run's own folder is made in a private local folder (the collector appends to
its journal and lists), its outputs go to the store as they are made (workers/store.py), and at
the end each of its files is uploaded and the local copy removed with the private folder.
"""

from __future__ import annotations

import logging
import os
import secrets
import time

from settings.config import ConfigError
from workers.store import Store, join, store_errors, why

log = logging.getLogger(__name__)

FIRST_LAST = "report.json"  # uploaded last: its presence says the run folder is whole


def check_store(results: str) -> None:
    """The store takes run folders: a marker object written and deleted now, so an unreachable
    store, a missing bucket or a refusal is a ConfigError (exit 2) naming the URL and why."""
    marker = f".write-check-{secrets.token_hex(4)}"
    try:
        store = Store(results)
        store.write(marker, b"")
        store.remove(marker)
    except ValueError as exc:  # no fsspec, or no package for the scheme
        raise ConfigError(f"config results: {exc}") from None
    except store_errors() as exc:
        raise ConfigError(f"config results: cannot write run folders in {results!r} ({why(exc)})") from None


def name_taken(results: str, name: str) -> bool:
    """``RESULTS/NAME/report.json`` exists (a run that finished there); a store that cannot say
    is a ConfigError naming it."""
    try:
        return Store(results).exists(f"{name}/{FIRST_LAST}")
    except store_errors() as exc:
        raise ConfigError(f"config results: cannot look for run folder {name!r} in {results!r} ({why(exc)})") from None


def make_local_run_dir(results: str, name: str, exist_ok: bool, local: str, output_names) -> str:
    """The run's own folder, ``local/NAME`` (``local``: a private folder the caller removes); the
    name checked in the store first. With ``exist_ok`` a finished run's ``output_names`` are
    removed from the store first; without a name, a fresh timestamp free in the store."""
    if not local:
        raise ValueError(f"expected a private local folder for a run folder in {results}, got none")
    if name:
        if name_taken(results, name):
            if not exist_ok:
                raise ConfigError(f"--name: run folder {join(results, name)!r} exists (made by another run just "
                                  "now); choose another --name or pass --exist-ok to reuse it")
            clear_store_outputs(join(results, name), output_names)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name, n = stamp, 1
        while name_taken(results, name):
            n += 1
            name = f"{stamp}-{n}"
    path = os.path.join(local, name)
    os.mkdir(path)
    return path


def clear_store_outputs(root: str, output_names) -> list[str]:
    """--exist-ok in a store: an earlier run's outputs (images/, report.json, ...) under ``root``
    removed; other objects stay."""
    store = Store(root)
    removed = []
    for name in output_names:
        if store.exists(name):
            store.remove(name)
            removed.append(name)
    if removed:
        log.info("--exist-ok: removed the earlier run's %s from %s", ", ".join(removed), root)
    return removed


def upload_run_folder(run_dir: str, root: str) -> dict[str, str]:
    """Every file of the local ``run_dir`` (but hidden ones: the journal, partial lists) to
    ``root``, report.json last; returns {relative name: why} of those that failed."""
    store = Store(root)
    files = sorted(os.path.relpath(os.path.join(top, name), run_dir).replace(os.sep, "/")
                   for top, dirs, names in os.walk(run_dir) for name in names if not name.startswith("."))
    failed = {}
    for relative in sorted(files, key=lambda f: f == FIRST_LAST):
        try:
            store.put(os.path.join(run_dir, relative), relative)
        except store_errors() as exc:
            failed[relative] = why(exc)
            log.error("could not upload %s to %s: %s", relative, store.where(relative), failed[relative])
    return failed
