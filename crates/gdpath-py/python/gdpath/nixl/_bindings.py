"""NIXL's binding-level names on gdpath: memory segment types, the initiator's agent name,
the default side-channel port and the exception classes of ``nixl._bindings``.

NIXL's exceptions are ``RuntimeError`` subclasses, one per ``nixl_status_t`` error
(``NIXL_ERR_NOT_FOUND`` is :class:`nixlNotFoundError`, ...). Here each one is also a
:class:`gdpath.GdpathError`: ``kind`` and ``finding`` are the engine's when the engine raised
it (``peer_failed``, ``blocks``, ``net.peer-failed`` ...), else ``kind`` is the NIXL status
name, and ``cause`` is the engine's exception itself, so code written for NIXL catches the
class it expects and code written for gdpath reads what failed.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ..errors import GdpathError

__all__ = [
    "DRAM_SEG",
    "VRAM_SEG",
    "FILE_SEG",
    "BLK_SEG",
    "OBJ_SEG",
    "NIXL_INIT_AGENT",
    "DEFAULT_COMM_PORT",
    "nixlError",
    "nixlNotPostedError",
    "nixlInvalidParamError",
    "nixlBackendError",
    "nixlNotFoundError",
    "nixlMismatchError",
    "nixlNotAllowedError",
    "nixlRepostActiveError",
    "nixlUnknownError",
    "nixlNotSupportedError",
    "nixlRemoteDisconnectError",
    "nixlCancelledError",
    "nixlNoTelemetryError",
    "nixlXferTelemetry",
]

# Memory segment types, by the names NIXL's Python API maps its strings to.
DRAM_SEG = "DRAM"
VRAM_SEG = "VRAM"
FILE_SEG = "FILE"
BLK_SEG = "BLOCK"
OBJ_SEG = "OBJ"

# The agent name `prep_xfer_dlist` takes for the initiator's own (local) side.
NIXL_INIT_AGENT = "NIXL_INIT_AGENT"
# NIXL's default side-channel port (`nixl_types.h`); here it is the port of gdpath's
# authenticated agent-to-agent channel (`gdpath serve`).
DEFAULT_COMM_PORT = 8888


class nixlError(GdpathError, RuntimeError):
    """Base of the NIXL exceptions here (NIXL's own derive from ``RuntimeError`` directly).
    ``status`` is the NIXL status name (``NIXL_ERR_NOT_FOUND`` ...)."""

    status = "NIXL_ERR_UNKNOWN"
    cause: Optional[BaseException]

    def __init__(self, message: str, kind: Optional[str] = None, finding: Optional[str] = None, **details: Any):
        details.setdefault("cause", None)
        super().__init__(message, kind or self.status, finding, **details)


class nixlNotPostedError(nixlError):
    """``NIXL_ERR_NOT_POSTED``: the transfer was never posted."""

    status = "NIXL_ERR_NOT_POSTED"


class nixlInvalidParamError(nixlError, ValueError):
    """``NIXL_ERR_INVALID_PARAM``: an argument NIXL's API refuses (an unknown op, indices out
    of range, lists of different lengths, a descriptor list of the wrong kind)."""

    status = "NIXL_ERR_INVALID_PARAM"


class nixlBackendError(nixlError):
    """``NIXL_ERR_BACKEND``: the engine refused or failed the request; ``kind`` and
    ``finding`` say why."""

    status = "NIXL_ERR_BACKEND"


class nixlNotFoundError(nixlError, LookupError):
    """``NIXL_ERR_NOT_FOUND``: an unknown (or removed) agent, a released handle, memory not
    registered (locally, or in the remote agent's metadata)."""

    status = "NIXL_ERR_NOT_FOUND"


class nixlMismatchError(nixlError):
    """``NIXL_ERR_MISMATCH``: descriptors of different lengths or memory types paired, or a
    peer whose authenticated name is not the one its metadata claims."""

    status = "NIXL_ERR_MISMATCH"


class nixlNotAllowedError(nixlError):
    """``NIXL_ERR_NOT_ALLOWED``: the request is valid but not now (memory in use by a
    transfer, a read into read-only memory)."""

    status = "NIXL_ERR_NOT_ALLOWED"


class nixlRepostActiveError(nixlError):
    """``NIXL_ERR_REPOST_ACTIVE``: ``transfer`` of a handle whose transfer is in flight."""

    status = "NIXL_ERR_REPOST_ACTIVE"


class nixlUnknownError(nixlError):
    """``NIXL_ERR_UNKNOWN``."""

    status = "NIXL_ERR_UNKNOWN"


class nixlNotSupportedError(nixlError):
    """``NIXL_ERR_NOT_SUPPORTED``: a backend, memory type or call gdpath does not provide
    (docs/nixl.md, "Not supported")."""

    status = "NIXL_ERR_NOT_SUPPORTED"


class nixlRemoteDisconnectError(nixlError, ConnectionError):
    """``NIXL_ERR_REMOTE_DISCONNECT``: the remote agent failed or left."""

    status = "NIXL_ERR_REMOTE_DISCONNECT"


class nixlCancelledError(nixlError):
    """``NIXL_ERR_CANCELED``: the transfer was cancelled or ran past its deadline."""

    status = "NIXL_ERR_CANCELED"


class nixlNoTelemetryError(nixlError):
    """``NIXL_ERR_NO_TELEMETRY``: gdpath keeps no NIXL telemetry."""

    status = "NIXL_ERR_NO_TELEMETRY"


class nixlXferTelemetry:
    """What ``get_xfer_telemetry`` says of a transfer's last post, in NIXL's field names:
    ``startTime`` (µs since the Unix epoch, when ``transfer`` was called), ``postDuration``
    (µs spent in ``transfer``), ``xferDuration`` (µs from the call to completion, 0 while in
    flight), ``totalBytes`` (bytes of every descriptor) and ``descCount`` (descriptors)."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes", "descCount")

    def __init__(self, startTime: int = 0, postDuration: int = 0, xferDuration: int = 0, totalBytes: int = 0, descCount: int = 0):
        self.startTime, self.postDuration, self.xferDuration = startTime, postDuration, xferDuration
        self.totalBytes, self.descCount = totalBytes, descCount

    def __repr__(self) -> str:
        return (f"nixlXferTelemetry(startTime={self.startTime}, postDuration={self.postDuration}, "
                f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, descCount={self.descCount})")


# The NIXL class for each engine error kind (gdpath::Error::kind, docs/python.md "Errors").
_BY_KIND: Dict[str, type] = {
    "out_of_bounds": nixlInvalidParamError,
    "list_length_mismatch": nixlInvalidParamError,
    "pair_length_mismatch": nixlMismatchError,
    "blocks": nixlInvalidParamError,
    "foreign_region": nixlNotFoundError,
    "deregistered": nixlNotFoundError,
    "region_busy": nixlNotAllowedError,
    "read_only_memory": nixlNotAllowedError,
    "read_only": nixlNotAllowedError,
    "unsupported": nixlNotSupportedError,
    "no_path": nixlNotSupportedError,
    "peer_failed": nixlRemoteDisconnectError,
    "auth_failed": nixlRemoteDisconnectError,
    "protocol": nixlRemoteDisconnectError,
    "cancelled": nixlCancelledError,
    "deadline_exceeded": nixlCancelledError,
}


def from_gdpath(e: BaseException, what: str = "") -> nixlError:
    """The NIXL exception for gdpath's exception ``e``, with its kind, finding and ``e`` as
    ``cause``; ``what`` says which call failed."""
    kind = getattr(e, "kind", None)
    finding = getattr(e, "finding", None)
    if kind == "refused" and finding == "net.peer-failed":
        cls: type = nixlRemoteDisconnectError
    else:
        cls = _BY_KIND.get(kind or "", nixlBackendError)
    text = f"{what}: {e}" if what else str(e)
    return cls(text, kind, finding, cause=e)
