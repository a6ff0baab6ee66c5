"""Exceptions of gdpath.

Every error the engine reports is a :class:`GdpathError` whose ``kind`` is the engine's stable
error kind (``gdpath::Error::kind()`` in Rust, the ``kind`` of the CLI's ``gdpath.error/1``
JSON): ``out_of_bounds``, ``read_only_memory``, ``short_file``, ``open``, ``unsupported``,
``path_not_accepted``, ``peer_failed``, ``deadline_exceeded``, ``cancelled`` ... plus
``checkpoint`` for a malformed checkpoint, ``usage`` for a bad argument of ``gdpath.doctor`` and
``topology`` for a machine description that cannot be read. ``finding`` is the doctor's finding
id that explains a refusal (``storage.odirect-unsupported``, ``gds.compat-mode``), or ``None``.

Subclasses group kinds a caller may want to catch alone; each is still a ``GdpathError`` with its
``kind``. A failed transfer raises :class:`TransferError` (its ``kind`` is the cause's) with the
``outcomes`` of every descriptor pair.
"""

from __future__ import annotations

import errno as _errno
import os as _os
from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "GdpathError",
    "DescriptorError",
    "BlockError",
    "ReadOnlyMemoryError",
    "UnsupportedError",
    "PathNotAcceptedError",
    "StorageError",
    "PeerError",
    "CheckpointError",
    "TransferError",
    "DeadlineExceeded",
    "Cancelled",
]


class GdpathError(Exception):
    """An error reported by the gdpath engine.

    Attributes:
        kind: the engine's error kind (stable; see the module docstring).
        finding: the finding id that explains the refusal, or ``None``.
        message: the engine's message (also ``str(error)``).
        index: the descriptor pair the error is about, where it names one.
    """

    kind: str
    finding: Optional[str]
    message: str
    index: Optional[int]

    def __init__(self, message: str, kind: str = "other", finding: Optional[str] = None, **details: Any):
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.finding = finding
        self.index = details.pop("index", None)
        for k, v in details.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, finding={self.finding!r}, message={self.message!r})"


class DescriptorError(GdpathError, ValueError):
    """A request the engine refused before moving a byte: lists or pairs of different lengths,
    a descriptor outside its region, a region of another agent (kinds ``out_of_bounds``,
    ``list_length_mismatch``, ``pair_length_mismatch``, ``foreign_region``, ``short_file``),
    a region whose registered object's memory moved or was freed since registration
    (``memory_moved``: a ``ctypes.resize``, an array's ``__setstate__``)."""


class BlockError(DescriptorError):
    """A block transfer's layouts or ids the engine refused before moving a byte (kind
    ``blocks``; ``gdpath::blocks::BlockError``). ``reason`` names the check:

    - at ``agent.prepare_blocks``: ``zero_block_size``, ``zero_count`` (``dim``),
      ``too_many_blocks``, ``overflow``, ``overlap`` (destination slots share bytes: ``dim``,
      ``stride``, ``needed`` bytes), ``out_of_bounds`` (the layout reaches past its region:
      ``first_bad`` block, ``needed`` and ``region_len`` bytes), ``mismatch`` (``what`` differs:
      ``src``, ``dst``), ``shared_region_layouts``;
    - at ``transfer``: ``empty``, ``id_count_mismatch`` (``src``, ``dst`` counts),
      ``negative_id``, ``id_out_of_range`` (``position`` in the list, ``id``, ``blocks``),
      ``duplicate_destination``, ``source_is_destination``, ``too_many_descriptors``.

    ``side`` is ``"source"`` or ``"destination"`` where the check is about one side."""

    reason: str
    side: Optional[str]

    def __init__(self, message: str, kind: str = "blocks", finding: Optional[str] = None, **details: Any):
        details.setdefault("side", None)
        super().__init__(message, kind, finding, **details)


class ReadOnlyMemoryError(GdpathError):
    """Read-only memory (``bytes``, a read-only array, ``read_only=True``) would be written
    (kinds ``read_only_memory``, and ``read_only`` for a file opened with mode ``"r"``)."""


class UnsupportedError(GdpathError):
    """What was asked needs a backend this machine does not have (``unsupported``: GPU or pinned
    memory without a CUDA driver, remote memory without UCX) or no backend moves the pair
    (``no_path``), or every backend refused it (``refused``, with its ``finding``; a pair
    refused because its peer failed earlier, finding ``net.peer-failed``, is a
    :class:`PeerError` instead)."""


class PathNotAcceptedError(GdpathError):
    """Strict mode: a pair cannot take an accepted path (``path_not_accepted``). ``planned`` is
    the path it would have taken, ``finding`` why the accepted one is impossible."""

    planned: Optional[str]


class StorageError(GdpathError, OSError):
    """A file could not be opened, read or written (kinds ``open``, ``io``, ``not_a_file``,
    ``misaligned``, ``no_space`` for a full file system, ``exists`` for a file not to be
    replaced, ``symlink_refused`` for a symbolic link another user planted in a sticky
    world-writable directory, which the kernel's ``protected_symlinks`` rule does not follow,
    ``foreign_file_refused`` for another user's file in such a directory, which the kernel's
    ``protected_regular`` rule does not let a writer replace, ``magic_link_refused`` for a
    path through a magic link of ``/proc`` such as ``/dev/stdout``).
    ``errno`` and ``filename`` are set where the system named them, and the error is then also
    the ``OSError`` subclass Python's ``open()`` raises for that errno (``FileNotFoundError``
    for ``ENOENT``, ``PermissionError`` for ``EACCES`` — ``symlink_refused`` and
    ``foreign_file_refused`` too, as the kernel's own refusals —, ``FileExistsError`` for
    ``exists``, ``IsADirectoryError``, ``NotADirectoryError``). ``not_a_file`` carries the errno
    ``open(2)`` gives: ``EISDIR`` for a directory (``IsADirectoryError``), ``ENXIO`` for a FIFO
    or socket, ``ENOENT`` for a dangling link; none for a device, nor for
    ``magic_link_refused``."""

    def __str__(self) -> str:
        # OSError's own text would be "[Errno 2] ..." without gdpath's message.
        return self.message

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_restore_os, (type(self), self.message, self.kind, self.finding, self.errno, self.filename, dict(self.__dict__)))


class PeerError(GdpathError, ConnectionError):
    """A peer agent failed, refused authentication or broke the protocol (kinds
    ``peer_failed``, ``auth_failed``, ``protocol``, ``ucx``), and a post to a peer that failed
    earlier (kind ``refused``, finding ``net.peer-failed``)."""


# The finding of a pair refused because its peer failed (the engine's `ids::NET_PEER_FAILED`).
_PEER_FAILED = "net.peer-failed"


class CheckpointError(GdpathError, ValueError):
    """A file that is not a valid safetensors checkpoint, an index that does not describe its
    shards, or a tensor name it does not hold (kind ``checkpoint``)."""


class TransferError(GdpathError):
    """A posted transfer that failed, was cancelled or ran past its deadline. ``kind`` and
    ``finding`` are the cause's (the first failed pair's, ``cancelled`` or
    ``deadline_exceeded``); ``outcomes`` has one ``(index, state, detail)`` per pair, ``state``
    being ``"done"`` (``detail``: its ``PairReport``), ``"failed"`` (its error message) or
    ``"not_done"``."""

    outcomes: List[Tuple[int, str, Any]]

    def completed(self) -> List[int]:
        """Indices of the pairs that completed."""
        return [i for i, state, _ in self.outcomes if state == "done"]


class DeadlineExceeded(TransferError, TimeoutError):
    """The transfer did not complete by its deadline (or the wait's timeout); it was cancelled."""


class Cancelled(TransferError):
    """The transfer was cancelled."""


_BY_KIND: Dict[str, type] = {
    "out_of_bounds": DescriptorError,
    "list_length_mismatch": DescriptorError,
    "pair_length_mismatch": DescriptorError,
    "foreign_region": DescriptorError,
    "short_file": DescriptorError,
    "memory_moved": DescriptorError,
    "blocks": BlockError,
    "read_only_memory": ReadOnlyMemoryError,
    "read_only": ReadOnlyMemoryError,
    "unsupported": UnsupportedError,
    "no_path": UnsupportedError,
    "refused": UnsupportedError,
    "path_not_accepted": PathNotAcceptedError,
    "open": StorageError,
    "io": StorageError,
    "not_a_file": StorageError,
    "misaligned": StorageError,
    "no_space": StorageError,
    "exists": StorageError,
    "symlink_refused": StorageError,
    "foreign_file_refused": StorageError,
    "magic_link_refused": StorageError,
    "peer_failed": PeerError,
    "auth_failed": PeerError,
    "protocol": PeerError,
    "ucx": PeerError,
    "checkpoint": CheckpointError,
}


# The OSError subclass Python's own open() raises for an errno; a file error of gdpath is
# raised as both, so ``except FileNotFoundError`` catches a missing checkpoint as it does for
# safetensors.
_OS_BY_ERRNO = {
    _errno.ENOENT: FileNotFoundError,
    _errno.EACCES: PermissionError,
    _errno.EPERM: PermissionError,
    _errno.EEXIST: FileExistsError,
    _errno.EISDIR: IsADirectoryError,
    _errno.ENOTDIR: NotADirectoryError,
}
_OS_SUBCLASSES: Dict[Tuple[type, type], type] = {}


def _os_subclass(cls: type, code: Optional[int]) -> type:
    """``cls`` joined with the OSError subclass ``code`` names (cached), or ``cls`` itself."""
    os_cls = _OS_BY_ERRNO.get(code) if code is not None else None
    if os_cls is None:
        return cls
    key = (cls, os_cls)
    if key not in _OS_SUBCLASSES:
        # Named as the class it extends (repr, tracebacks), found by pickle under its own
        # module-level name.
        qualname = f"_{cls.__name__}_{os_cls.__name__}"
        joined = type(cls.__name__, (cls, os_cls), {"__module__": __name__, "__doc__": cls.__doc__, "__qualname__": qualname})
        globals()[qualname] = joined
        _OS_SUBCLASSES[key] = joined
    return _OS_SUBCLASSES[key]


def _restore_os(cls: type, message: str, kind: str, finding: Optional[str], code: Optional[int], filename: Any, state: Dict[str, Any]) -> GdpathError:
    """Unpickles a file error: ``errno`` and ``filename`` live in OSError's own slots, which
    OSError's pickling drops when the arguments are gdpath's message."""
    e = cls.__new__(cls, message)
    GdpathError.__init__(e, message, kind, finding)
    e.__dict__.update(state)
    if code is not None:
        e.errno, e.strerror = code, _os.strerror(code)
    e.filename = filename
    return e


_HINTS = {
    "exists": ": pass overwrite=True to replace it",
    "read_only": ': register gdpath.File(path, mode="r+") to write it',
}


def _from_native(kind: str, message: str, finding: Optional[str], details: Optional[Dict[str, Any]]) -> GdpathError:
    """Builds the exception for an error of ``kind`` (called by the native module)."""
    details = dict(details or {})
    # The engine's message names no API: say the Python way to do what was refused.
    message += _HINTS.get(kind, "")
    if details.pop("transfer_failed", False):
        cls: type = {"deadline_exceeded": DeadlineExceeded, "cancelled": Cancelled}.get(kind, TransferError)
    elif kind == "deadline_exceeded":
        cls = DeadlineExceeded
        details.setdefault("outcomes", [])
    elif kind == "cancelled":
        cls = Cancelled
        details.setdefault("outcomes", [])
    elif kind == "refused" and finding == _PEER_FAILED:
        # Every backend refused the pair because its peer failed earlier: a lost peer, as the
        # transfer that met the failure reported it.
        cls = PeerError
    else:
        cls = _BY_KIND.get(kind, GdpathError)
    if issubclass(cls, OSError):
        code = details.get("errno", _errno.EEXIST if kind == "exists" else None)
        cls = _os_subclass(cls, code)
        # OSError's own constructor reads its arguments as (errno, strerror): build it as a
        # GdpathError and keep the message as its only argument.
        e = cls.__new__(cls, message)
        GdpathError.__init__(e, message, kind, finding, **details)
        if code is not None:
            e.errno, e.strerror = code, _os.strerror(code)
        return e
    return cls(message, kind, finding, **details)
