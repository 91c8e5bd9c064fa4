"""Optional packages (openvino, ray): imported only where a run uses them, and a missing one is
an error that names what to install."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here (found, not imported)."""
    return importlib.util.find_spec(package) is not None


def import_optional(package: str, error: type[Exception], missing: str) -> ModuleType:
    """The module ``package``, or ``error(missing)`` when it is not installed."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise error(missing) from None
