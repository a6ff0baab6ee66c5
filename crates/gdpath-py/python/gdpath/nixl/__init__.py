"""NIXL's Python API on gdpath (``gdpath.nixl``): ``nixl_agent`` and ``nixl_agent_config`` as
``nixl._api`` defines them, the exceptions of ``nixl._bindings``, and :func:`install` /
:func:`uninstall`, which make ``import nixl`` resolve to this package for programs written for
NIXL (vLLM's ``NixlConnector``, SGLang's NIXL backend). Reference: ``docs/nixl.md``.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Dict, Optional

from . import _api, _bindings
from ._api import (
    DEFAULT_COMM_PORT,
    nixl_agent,
    nixl_agent_config,
    nixl_prepped_dlist_handle,
    nixl_xfer_handle,
    nixlRegDList,
    nixlXferDList,
)
from ._bindings import (
    NIXL_INIT_AGENT,
    nixlBackendError,
    nixlCancelledError,
    nixlError,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotPostedError,
    nixlNotSupportedError,
    nixlRemoteDisconnectError,
    nixlRepostActiveError,
    nixlUnknownError,
)

__all__ = [
    "DEFAULT_COMM_PORT",
    "NIXL_INIT_AGENT",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_prepped_dlist_handle",
    "nixl_xfer_handle",
    "nixlRegDList",
    "nixlXferDList",
    "nixlError",
    "nixlBackendError",
    "nixlCancelledError",
    "nixlInvalidParamError",
    "nixlMismatchError",
    "nixlNoTelemetryError",
    "nixlNotAllowedError",
    "nixlNotFoundError",
    "nixlNotPostedError",
    "nixlNotSupportedError",
    "nixlRemoteDisconnectError",
    "nixlRepostActiveError",
    "nixlUnknownError",
    "install",
    "uninstall",
    "installed",
]

# The module names NIXL's users import, and what each resolves to once installed.
_ALIASES = {"nixl": sys.modules[__name__], "nixl._api": _api, "nixl._bindings": _bindings}
# What `install` replaced (None: the name was not imported), for `uninstall`.
_saved: Optional[Dict[str, object]] = None


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _saved is not None


def install(force: bool = False) -> None:
    """Makes ``import nixl``, ``from nixl import nixl_agent``, ``from nixl._api import
    nixl_agent`` and ``from nixl._bindings import nixlNotFoundError`` resolve to gdpath in
    this process (entries in ``sys.modules``; a process started later needs its own call,
    docs/nixl.md). Raises ``ImportError`` when a real NIXL is installed or imported, unless
    ``force=True``, which shadows it until :func:`uninstall`. Calling it twice is harmless."""
    global _saved
    if _saved is not None:
        return
    if not force:
        real = None
        loaded = sys.modules.get("nixl")
        if loaded is not None and loaded is not _ALIASES["nixl"]:
            real = getattr(loaded, "__file__", None) or repr(loaded)
        else:
            try:
                spec = importlib.util.find_spec("nixl")
            except (ImportError, ValueError):
                spec = None
            if spec is not None:
                real = spec.origin or str(list(spec.submodule_search_locations or []))
        if real is not None:
            raise ImportError(
                f"a NIXL is installed ({real}): gdpath.nixl.install() does not shadow it; "
                "pass force=True to use gdpath in its place in this process"
            )
    _saved = {name: sys.modules.get(name) for name in _ALIASES}
    for name, mod in _ALIASES.items():
        sys.modules[name] = mod


def uninstall() -> None:
    """Undoes :func:`install`: the names resolve as before it (a real NIXL again, if one
    was shadowed). Harmless when not installed."""
    global _saved
    if _saved is None:
        return
    for name, old in _saved.items():
        if sys.modules.get(name) is _ALIASES[name]:
            if old is None:
                del sys.modules[name]
            else:
                sys.modules[name] = old  # type: ignore[assignment]
    _saved = None
