"""gdpath: GPUDirect data paths from Python.

Register memory (PyTorch tensors, CuPy and NumPy arrays, anything with DLPack,
``__cuda_array_interface__`` or the buffer protocol, and files) with an :class:`Agent`, post
transfers between descriptors (or KV-cache blocks: :class:`KvLayout`,
``agent.prepare_blocks``), and see which path moved each pair (P2P, GDR, GDS, O_DIRECT,
staged ...) and, when it was not the preferred one, the doctor's finding id that says why.
Transfers release the GIL while bytes move and can be awaited in asyncio. Safetensors
checkpoints load through :mod:`gdpath.safetensors` into one allocation; :func:`topo` and
:func:`doctor` return the documents of ``gdpath topo --json`` and ``gdpath doctor --json``.

Units: bytes; seconds; GB/s = 1e9 B/s. Reference: ``docs/python.md``.
"""

from __future__ import annotations

import json as _json
import os as _os
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _native
from ._native import (
    Agent,
    BatchReport,
    Checkpoint,
    ClusterPeer,
    ClusterWatch,
    Descriptor,
    DLPackView,
    File,
    KvLayout,
    LoadedCheckpoint,
    Notification,
    PairReport,
    Peer,
    PlannedPair,
    PreparedBlocks,
    Region,
    RemoteRegion,
    Server,
    TensorInfo,
    Transfer,
    TransferReport,
    __version__,
)
from .errors import (
    BlockError,
    Cancelled,
    CheckpointError,
    DeadlineExceeded,
    DescriptorError,
    GdpathError,
    PathNotAcceptedError,
    PeerError,
    ReadOnlyMemoryError,
    StorageError,
    TransferError,
    UnsupportedError,
)

__all__ = [
    "Agent",
    "BatchReport",
    "Checkpoint",
    "ClusterPeer",
    "ClusterWatch",
    "Descriptor",
    "DLPackView",
    "File",
    "KvLayout",
    "LoadedCheckpoint",
    "Notification",
    "PairReport",
    "Peer",
    "PlannedPair",
    "PreparedBlocks",
    "Region",
    "RemoteRegion",
    "Server",
    "TensorInfo",
    "Transfer",
    "TransferReport",
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
    "topo",
    "doctor",
    "topo_json",
    "doctor_json",
    "default_agent",
]

PathLike = Union[str, "_os.PathLike[str]"]


def topo_json(
    *,
    snapshot: Optional[PathLike] = None,
    sysfs_root: Optional[PathLike] = None,
    hwloc_xml: Optional[PathLike] = None,
    nccl_xml: Optional[PathLike] = None,
    smi_topo: Optional[PathLike] = None,
) -> str:
    """The ``gdpath.topo/1`` document as text, byte for byte what ``gdpath topo --json``
    prints (without its final newline), for the live machine or the one replay source given:
    a snapshot written by ``gdpath topo capture``, a copied sysfs tree (holding ``sys/``), an
    hwloc XML export, an NCCL topology XML or the text ``nvidia-smi topo -m`` printed. Raises
    :class:`GdpathError` of kind ``topology`` when the source cannot be read, ``ValueError``
    for two sources."""
    return _native.topo_json(
        snapshot=snapshot, sysfs_root=sysfs_root, hwloc_xml=hwloc_xml, nccl_xml=nccl_xml, smi_topo=smi_topo
    )


def topo(
    *,
    snapshot: Optional[PathLike] = None,
    sysfs_root: Optional[PathLike] = None,
    hwloc_xml: Optional[PathLike] = None,
    nccl_xml: Optional[PathLike] = None,
    smi_topo: Optional[PathLike] = None,
) -> Dict[str, Any]:
    """The ``gdpath.topo/1`` document as a dict: GPUs, NICs, NVMe, the PCIe tree, NUMA, the
    pair matrix (X, NV#, PIX, PXB, PHB, NODE, SYS), nearest devices and warnings. Arguments as
    :func:`topo_json`."""
    return _json.loads(
        topo_json(snapshot=snapshot, sysfs_root=sysfs_root, hwloc_xml=hwloc_xml, nccl_xml=nccl_xml, smi_topo=smi_topo)
    )


def doctor_json(
    *,
    snapshot: Optional[PathLike] = None,
    sysfs_root: Optional[PathLike] = None,
    hwloc_xml: Optional[PathLike] = None,
    nccl_xml: Optional[PathLike] = None,
    smi_topo: Optional[PathLike] = None,
    paths: Union[PathLike, Sequence[PathLike], None] = None,
    measure: bool = False,
) -> str:
    """The ``gdpath.doctor/1`` document as text, byte for byte what ``gdpath doctor --json``
    prints with the same arguments (without its final newline): ``paths`` are the GDS
    directories, one path or a list (``--path``; default the current directory on the live
    machine, none in a replay), ``measure`` runs the measured
    probes (``--measure``; live only). Raises :class:`GdpathError` of kind ``usage`` for a
    path that is not a directory, ``topology`` for a source that cannot be read."""
    text, _code = _native.doctor_json(
        snapshot=snapshot,
        sysfs_root=sysfs_root,
        hwloc_xml=hwloc_xml,
        nccl_xml=nccl_xml,
        smi_topo=smi_topo,
        paths=_path_list(paths),
        measure=measure,
    )
    return text


def _path_list(paths: Union[PathLike, Sequence[PathLike], None]) -> Optional[List[str]]:
    """``paths`` as a list of str: one path (str, bytes, os.PathLike) is a list of one, not of
    its characters."""
    if paths is None:
        return None
    if isinstance(paths, (str, bytes, _os.PathLike)):
        return [_os.fsdecode(paths)]
    return [_os.fsdecode(p) for p in paths]


def doctor(
    *,
    snapshot: Optional[PathLike] = None,
    sysfs_root: Optional[PathLike] = None,
    hwloc_xml: Optional[PathLike] = None,
    nccl_xml: Optional[PathLike] = None,
    smi_topo: Optional[PathLike] = None,
    paths: Union[PathLike, Sequence[PathLike], None] = None,
    measure: bool = False,
) -> Dict[str, Any]:
    """The ``gdpath.doctor/1`` document as a dict: for P2P, GDR and GDS the findings (id,
    status ok/degraded/unavailable/unknown/not-run, evidence, remedy) and a verdict per path.
    Arguments as :func:`doctor_json`."""
    return _json.loads(
        doctor_json(
            snapshot=snapshot,
            sysfs_root=sysfs_root,
            hwloc_xml=hwloc_xml,
            nccl_xml=nccl_xml,
            smi_topo=smi_topo,
            paths=paths,
            measure=measure,
        )
    )


_default: Optional[Agent] = None


def default_agent() -> Agent:
    """The module's agent, made on first use (``Agent()``): what :mod:`gdpath.safetensors`
    saves with when given none (its loads take agents set up by the storage chooser)."""
    global _default
    if _default is None:
        _default = Agent()
    return _default


# `gdpath.safetensors` after `import gdpath` alone, as users of `safetensors` expect its
# framework modules to be there; it imports NumPy or PyTorch only when used.
from . import metrics, safetensors  # noqa: E402
