"""Before a cluster run: can every node read the source? A few of the plan's locations (its
first, middle and last item) are looked at from each node, through its actor, and a node that
cannot read one is said at once, naming the node and the location (exit 2): a path that is not
mounted there, a store its credentials or endpoint do not reach. Without this the node would
only fail its frames one by one."""

from __future__ import annotations

import os

from inputs.object_store import is_store_url, unreachable as store_unreachable
from inputs.streams import is_url
from settings.config import ConfigError

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


def check_reach(ray, nodes, units) -> None:
    """Ask every node at once; SourceUnreachable naming each node that cannot read a location."""
    locations = sampled_locations(units)
    if not locations:
        return
    answers = ray.get([node.actor.reach.remote(locations) for node in nodes], timeout=REACH_TIMEOUT_S)
    failed = [f"{node.label} ({node.host}, {node.address}) cannot read {location}: {reason}"
              for node, found in zip(nodes, answers) for location, reason in found.items()]
    if failed:
        raise SourceUnreachable("--ray: the source must be readable from every node; " + "; ".join(failed))
