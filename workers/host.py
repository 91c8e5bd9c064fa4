"""Facts of the host that every process reads the same way."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask (as ``taskset``, a cgroup cpuset or a
    container's CPU set leave it), not the host's count, so worker counts follow what we get."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity masks on this platform
        return os.cpu_count() or 1
