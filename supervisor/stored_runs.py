"""Run folders in an object store (``--results s3://bucket/prefix``): the checks before the run,
the run's name, and its upload at the end.

A store has no folders to make and no atomic ``mkdir``: a run folder ``RESULTS/NAME`` is taken
when ``RESULTS/NAME/report.json`` exists (uploaded last, so a folder without it is a run that did
not finish): the next run is given ``NAME2``, as for folders. A run claims its name when it starts
with a marker object, ``RESULTS/NAME/.running`` (its host, pid and start), removed once its
report.json is up: a second run given that name meanwhile is refused (exit 2) unless
``--exist-ok``. Looking and then writing is not atomic: two runs started within that moment both
write there. The run's own folder is made in a private local folder (the collector appends to
its journal and lists), its outputs go to the store as they are made (workers/store.py), and at
the end each of its files is uploaded and the local copy removed with the private folder.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time

from settings.config import ConfigError
from workers.store import Store, join, store_errors, why

log = logging.getLogger(__name__)

FIRST_LAST = "report.json"  # uploaded last: its presence says the run folder is whole
RUNNING = ".running"  # a run's claim on its name while it runs (no report.json yet)


def check_store(results: str) -> None:
    """The store takes run folders: a marker object written and deleted now, so an unreachable
    store, a missing bucket or a refusal is a ConfigError (exit 2) naming the URL and why."""
    try:
        refused = write_refused(results)
    except ValueError as exc:  # no fsspec, or no package for the scheme
        raise ConfigError(f"config results: {exc}") from None
    if refused:
        raise ConfigError(f"config results: cannot write run folders in {results!r} ({refused})")


def write_refused(results: str) -> str | None:
    """Why this machine cannot write in ``results`` (a marker object ``.write-check-<hex>``
    written and deleted), or None. ValueError: no fsspec, or no package for the scheme."""
    store = Store(results)
    marker = f".write-check-{secrets.token_hex(4)}"
    try:
        store.write(marker, b"")
        store.remove(marker)
    except store_errors() as exc:
        return f"{why(exc)} writing {store.where(marker)}"
    return None


def name_taken(results: str, name: str) -> bool:
    """``RESULTS/NAME/report.json`` exists (a run that finished there); a store that cannot say
    is a ConfigError naming it."""
    try:
        return Store(results).exists(f"{name}/{FIRST_LAST}")
    except store_errors() as exc:
        raise ConfigError(f"config results: cannot look for run folder {name!r} in {results!r} ({why(exc)})") from None


def name_in_use(results: str, name: str) -> str | None:
    """What ``RESULTS/NAME/.running`` says (a run that started there and has not finished, or was
    killed), or None; a store that cannot say is a ConfigError naming it."""
    store = Store(join(results, name))
    try:
        if not store.exists(RUNNING):
            return None
        claim = json.loads(store.read(RUNNING) or b"{}")
    except ValueError:
        return "a run"
    except store_errors() as exc:
        raise ConfigError(f"config results: cannot look for run folder {name!r} in {results!r} ({why(exc)})") from None
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(claim.get("started_unix", 0)))
    return f"a run on {claim.get('host', '?')} (pid {claim.get('pid', '?')}) started at {started}"


def check_name_free(results: str, name: str, exist_ok: bool) -> None:
    """A run that has not finished holds ``name``: a ConfigError (exit 2) unless ``exist_ok``."""
    holder = None if exist_ok or not name or name_taken(results, name) else name_in_use(results, name)
    if holder:
        raise ConfigError(f"--name: run folder {join(results, name)!r} is being written by {holder} (its "
                          f"{RUNNING} marker, removed when that run finishes; a run that was killed leaves it); "
                          "choose another --name or pass --exist-ok to write there anyway")


def claim_name(root: str) -> None:
    """Mark ``root`` (``RESULTS/NAME``) as written by this run until :func:`release_name`."""
    claim = {"host": socket.gethostname(), "pid": os.getpid(), "started_unix": time.time()}
    try:
        Store(root).write(RUNNING, json.dumps(claim).encode())
    except store_errors() as exc:
        raise ConfigError(f"config results: cannot write run folder {root!r} ({why(exc)})") from None


def release_name(root: str) -> None:
    """The run's claim on ``root`` goes (its report.json, if any, is up)."""
    try:
        Store(root).remove(RUNNING)
    except FileNotFoundError:
        pass  # released already
    except store_errors() as exc:
        log.warning("could not remove %s: %s", Store(root).where(RUNNING), why(exc))


def release_unfinished(results: str, local: str) -> None:
    """The claims of the run folders made in the private folder ``local`` go: a run that stopped
    before its report went up (a finished run's upload removed its claim already)."""
    for name in os.listdir(local):
        release_name(join(results, name))


def make_local_run_dir(results: str, name: str, exist_ok: bool, local: str, output_names,
                       claimed: bool = False) -> str:
    """The run's own folder, ``local/NAME`` (``local``: a private folder the caller removes); the
    name checked in the store first, then claimed (``.running``). With ``exist_ok`` a finished
    run's ``output_names`` are removed from the store first; without a name, a fresh timestamp
    free in the store. ``claimed``: the name was checked and claimed by the cluster's driver
    whose share of the run this is: it is used as it is."""
    if not local:
        raise ValueError(f"expected a private local folder for a run folder in {results}, got none")
    if claimed:
        if not name:
            raise ValueError(f"expected the run's name for a share of a cluster run in {results}, got none")
    elif name:
        if name_taken(results, name) and not exist_ok:
            raise ConfigError(f"--name: run folder {join(results, name)!r} exists (made by another run just "
                              "now); choose another --name or pass --exist-ok to reuse it")
        check_name_free(results, name, exist_ok)
        if exist_ok:
            clear_store_outputs(join(results, name), output_names)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name, n = stamp, 1
        while name_taken(results, name) or name_in_use(results, name):
            n += 1
            name = f"{stamp}-{n}"
    path = os.path.join(local, name)
    os.makedirs(path)
    if not claimed:
        claim_name(join(results, name))
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
    ``root``, report.json last, and then the run's claim on the name goes; returns {relative
    name: why} of those that failed."""
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
    release_name(root)
    return failed
