"""Before a cluster run: can every node read the source, and write the results where they go
into a store? A few of the plan's locations (its first, middle and last item) are looked at from
each node, through its actor, and a node that cannot read one is said at once, naming the node and
the location (exit 2): a path that is not mounted there, a store its credentials or endpoint do
not reach. With ``--results`` in a store each node also writes and removes a marker object there
(``RESULTS/.write-check-<hex>``), as the driver does for itself: a node that cannot is named with
the object and why (exit 2). Without this the node would only fail its frames one by one, or
save none of its images."""

from __future__ import annotations

import os

from inputs.object_store import is_store_url, unreachable as store_unreachable
from inputs.streams import is_url
from settings.config import ConfigError
from supervisor.stored_runs import write_refused

SAMPLED_LOCATIONS = 3
REACH_TIMEOUT_S = 60.0


class SourceUnreachable(ConfigError):
    """A node cannot read the source: usage, exit 2."""


def sampled_locations(units) -> list[str]:
    """The first, middle and last unit's locations (synthetic frames have none)."""
    located = [u.location for u in units if u.location and u.kind != "broken"]
    picks = [located[0], located[len(located) // 2], located[-1]] if located else []
    return list(dict.fromkeys(picks))[:SAMPLED_LOCATIONS]


def unreachable(location: str) -> str | None:
    """Why this machine cannot read ``location``, or None. A URL OpenCV opens (http, rtsp) is
    not looked at here: its reader says what is wrong."""
    if is_store_url(location):
        return store_unreachable(location)
    if is_url(location):
        return None
    if not os.path.exists(location):
        return "no such file or directory"
    if not os.access(location, os.R_OK):
        return "permission denied"
    return None


def unwritable(results: str) -> str | None:
    """Why this machine cannot write in the store ``results``, or None."""
    try:
        return write_refused(results)
    except ValueError as exc:  # no fsspec, or no package for the scheme, on this node
        return str(exc)


def check_reach(ray, nodes, units, results: str = "") -> None:
    """Ask every node at once; SourceUnreachable naming each node that cannot read a location,
    or write in ``results`` when that is a store."""
    locations = sampled_locations(units)
    stored = is_store_url(results)
    reads = [node.actor.reach.remote(locations) for node in nodes] if locations else []
    writes = [node.actor.write_check.remote(results) for node in nodes] if stored else []
    if not reads and not writes:
        return
    answers = ray.get(reads + writes, timeout=REACH_TIMEOUT_S)
    read_answers, write_answers = answers[:len(reads)], answers[len(reads):]
    failed = [f"{node.label} ({node.host}, {node.address}) cannot read {location}: {reason}"
              for node, found in zip(nodes, read_answers) for location, reason in found.items()]
    unwritten = [f"{node.label} ({node.host}, {node.address}) cannot write in {results}: {reason}"
                 for node, reason in zip(nodes, write_answers) if reason]
    said = (["the source must be readable from every node; " + "; ".join(failed)] if failed else []) + (
        ["the results store must be writable from every node; " + "; ".join(unwritten)] if unwritten else [])
    if said:
        raise SourceUnreachable("--ray: " + "; ".join(said))
