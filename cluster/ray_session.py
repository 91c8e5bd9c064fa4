"""Joining a Ray cluster for a run: the ray module (or RayMissing naming the package), a quick
check that something answers at the address (Ray itself retries for minutes), ``ray.init`` with
this repository on the actors' path, and SIGTERM turned into Interrupted while joined."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket

from backends.optional import import_optional
from cluster.node import REPO_ROOT
from settings.config import ConfigError

log = logging.getLogger("cluster")

ADDRESS_TIMEOUT_S = 5.0  # a TCP connection to the head's address, before Ray's own minutes of retries


class RayMissing(RuntimeError):
    """--ray without the ray package installed."""


class ClusterUnreachable(ConfigError):
    """--ray ADDRESS where no cluster answers: usage, exit 2."""


class Interrupted(Exception):
    """SIGTERM on the driver, handled like Ctrl-C."""


def import_ray():
    """The ray module, or RayMissing naming the package to install."""
    return import_optional("ray", RayMissing, "--ray needs the ray package, which is not installed: pip install -r "
                           "requirements-ray.txt (ray==2.60.0)")


def connect(ray, address: str) -> None:
    """Join the cluster at ``address`` ("auto": the one this host belongs to); the actors import
    this repository, at the same path on every node."""
    ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": REPO_ROOT}}, log_to_driver=False,
             logging_level=logging.WARNING, configure_logging=False)


@contextlib.contextmanager
def joined(address: str):
    """Ray, joined to the cluster at ``address`` for the block (shut down after it); SIGTERM
    raises Interrupted there. Nothing answering at the address is a ClusterUnreachable (exit 2),
    found in seconds (Ray itself retries for minutes)."""
    ray = import_ray()
    check_address(address)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        try:
            connect(ray, address)
        except ConnectionError as exc:
            raise ClusterUnreachable(f"--ray {address}: {str(exc).splitlines()[0]}") from None
        except SystemExit as exc:  # ray.init's own SIGTERM handler is sys.exit(signum)
            if exc.code != signal.SIGTERM:
                raise
            raise Interrupted() from None
        signal.signal(signal.SIGTERM, _raise_interrupted)  # after ray.init, which sets its own
        yield ray
    finally:
        signal.signal(signal.SIGTERM, previous)
        with signals_noted():  # the run is over: a Ctrl-C now would only lose its report
            ray.shutdown()


def check_address(address: str, timeout_s: float = ADDRESS_TIMEOUT_S) -> None:
    """Something must answer at HOST:PORT (a head's GCS, or a Ray client server); "auto" is Ray's
    to find."""
    if address == "auto":
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise ClusterUnreachable(f"--ray: expected HOST:PORT (the head's address, e.g. 10.0.0.5:6379) or 'auto', "
                                 f"got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterUnreachable(f"--ray: nothing answers at {address} ({exc.strerror or exc}); start the head "
                                 "with `RAY_AUTH_MODE=token ray start --head` and pass its address") from None


@contextlib.contextmanager
def signals_noted():
    """Ctrl-C and SIGTERM while the run's end is taken care of: said, not acted on (every node's
    outputs are here; only leaving Ray and writing the merged folder are left, seconds)."""
    def say(_signum, _frame):
        log.warning("the run is over: leaving Ray and writing the merged run folder, nearly done")
    previous = {sig: signal.signal(sig, say) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _raise_interrupted(_signum, _frame) -> None:
    raise Interrupted()
