"""Type stubs of gdpath's native module (``gdpath._native``); the classes are re-exported by
``gdpath``. Units: bytes, seconds, GB/s = 1e9 B/s."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Dict, Generator, List, Optional, Sequence, Tuple, Union, final

_Path = Union[str, "os.PathLike[str]"]
_Side = Union["Region", "Descriptor", Sequence[Union["Region", "Descriptor"]]]
_Token = Union[str, bytes]
# Block ids: a 1-D int array (NumPy, a torch CPU tensor; int32/int64/uint32/uint64 are read in
# place) or any sequence of ints.
_Ids = Any

__all__ = [
    "Agent",
    "ClusterPeer",
    "ClusterWatch",
    "Region",
    "Descriptor",
    "File",
    "Transfer",
    "TransferReport",
    "PairReport",
    "PlannedPair",
    "Waker",
    "Server",
    "Peer",
    "RemoteRegion",
    "Notification",
    "Checkpoint",
    "LoadedCheckpoint",
    "TensorInfo",
    "DLPackView",
    "KvLayout",
    "PreparedBlocks",
    "BatchReport",
    "topo_json",
    "doctor_json",
    "metrics_text",
    "NOTIFICATION_TOKEN",
    "__version__",
]

__version__: str
NOTIFICATION_TOKEN: int

@final
class File:
    """A file to register: mode "r" (read-only), "r+" (read and write, existing), "w" (create or
    truncate), "a" (create if missing, keep what is there; writes land at the offsets their
    descriptors give, not appended); direct "auto" | "off" | "required" (O_DIRECT policy)."""

    def __new__(cls, path: _Path, mode: str = "r", direct: str = "auto") -> File: ...
    @property
    def path(self) -> Path: ...
    @property
    def mode(self) -> str: ...
    @property
    def direct(self) -> str: ...

@final
class ClusterPeer:
    @property
    def peer(self) -> Peer: ...
    @property
    def name(self) -> str: ...
    @property
    def incarnation(self) -> str: ...
    @property
    def gone(self) -> Optional[Tuple[float, str]]: ...
    def check(self) -> None: ...
    def wait(self, transfer: Transfer, timeout: Optional[float] = None) -> TransferReport: ...

@final
class ClusterWatch:
    def next(self, timeout: float = 0.0) -> Optional[Dict[str, Any]]: ...

@final
class Agent:
    def __new__(
        cls,
        name: Optional[str] = None,
        strict: bool = False,
        *,
        cluster: Optional[str] = None,
        lease_ttl: float = 10.0,
    ) -> Agent: ...
    def peer(self, name: str, *, token: Optional[_Token] = None, timeout: float = 10.0) -> ClusterPeer: ...
    def cluster_events(self) -> AsyncIterator[Dict[str, Any]]: ...
    def cluster_watch(self) -> ClusterWatch: ...
    def cluster_publish(self) -> bool: ...
    def cluster_leave(self) -> bool: ...
    @property
    def name(self) -> str: ...
    @property
    def strict(self) -> bool: ...
    @property
    def backends(self) -> List[str]: ...
    def register(
        self, obj: Any, *, pinned: Optional[bool] = None, read_only: bool = False, gpu: Optional[int] = None
    ) -> Region: ...
    def deregister(self, region: Region) -> None: ...
    def post(
        self,
        op: str,
        local: _Side,
        remote: _Side,
        *,
        accept: Union[str, Sequence[str], None] = None,
        timeout: Optional[float] = None,
        notify: Union[bytes, bytearray, memoryview, None] = None,
    ) -> Transfer: ...
    def plan(
        self, op: str, local: _Side, remote: _Side, *, accept: Union[str, Sequence[str], None] = None
    ) -> List[PlannedPair]: ...
    def enable_net(
        self,
        *,
        fast_local: bool = False,
        transports: Optional[str] = None,
        devices: Optional[str] = None,
        connect_timeout: float = 10.0,
        op_timeout: float = 60.0,
        shared_memory: bool = True,
    ) -> None: ...
    def serve(self, addr: str, *, token: Optional[_Token] = None, publish: bool = True) -> Server: ...
    def connect(self, addr: str, *, token: Optional[_Token] = None, timeout: float = 10.0) -> Peer: ...
    def export(self, region: Region) -> int: ...
    def unexport(self, region: Region) -> None: ...
    def take_notifications(self) -> List[Notification]: ...
    def wait_notification(self, timeout: float = 0.0) -> Optional[Notification]: ...
    def notification(self) -> Awaitable[Notification]: ...
    def _notify_notifications(self, waker: Waker) -> None: ...
    def prepare_blocks(
        self,
        src: KvLayout,
        dst: KvLayout,
        src_ids: Optional[_Ids] = None,
        dst_ids: Optional[_Ids] = None,
        *,
        method: Optional[str] = None,
    ) -> PreparedBlocks:
        """Checks the layouts against their regions and plans the path once; `src_ids` /
        `dst_ids` are kept for `PreparedBlocks.transfer()` without ids. `method`: None,
        "copies", "driver-batch", "kernel". Raises BlockError, ReadOnlyMemoryError,
        DescriptorError, UnsupportedError before any byte moves."""
    def transfer_blocks(
        self,
        src: KvLayout,
        dst: KvLayout,
        src_ids: _Ids,
        dst_ids: _Ids,
        *,
        method: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Transfer:
        """prepare_blocks(src, dst, method=method).transfer(src_ids, dst_ids, timeout=timeout)."""
    def post_columns(
        self,
        op: str,
        local_regions: Sequence[Region],
        local_which: _Ids,
        local_offsets: _Ids,
        remote_regions: Sequence[Region],
        remote_which: _Ids,
        remote_offsets: _Ids,
        lengths: _Ids,
        *,
        timeout: Optional[float] = None,
        notify: Optional[Union[bytes, str]] = None,
    ) -> Transfer:
        """One post of descriptor pairs given as columns (bytes): pair i is
        local_regions[local_which[i]] at local_offsets[i] with remote_regions[remote_which[i]]
        at remote_offsets[i], lengths[i] bytes each. Raises ValueError (column lengths),
        IndexError (a which entry), TypeError, and post's errors."""

@final
class Region:
    def desc(self, offset: int = 0, length: Optional[int] = None) -> Descriptor: ...
    def __getitem__(self, key: slice, /) -> Descriptor: ...
    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def id(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def pinned(self) -> bool: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def source(self) -> str: ...
    @property
    def obj(self) -> Any: ...
    @property
    def path(self) -> Optional[Path]: ...
    @property
    def in_flight(self) -> int: ...

@final
class Descriptor:
    def __new__(cls, region: Region, offset: int = 0, length: Optional[int] = None) -> Descriptor: ...
    @property
    def region(self) -> Region: ...
    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...
    def __len__(self) -> int: ...
    def __getitem__(self, key: slice, /) -> Descriptor: ...

@final
class BatchReport:
    """How a backend posted a batch of descriptors (a block transfer's one pair): method
    "copies" | "driver-batch" | "kernel"; descriptor counts as given and after merging; what
    the method ran; CPU posting time in ns."""

    method: str
    descriptors: int
    coalesced: int
    posted: int
    post_ns: int
    @property
    def post_us_per_descriptor(self) -> float: ...

@final
class PairReport:
    index: int
    bytes: int
    path: str
    finding: Optional[str]
    elapsed: float
    batch: Optional[BatchReport]

@final
class KvLayout:
    """Blocks of a paged KV cache in a region, in bytes: the slot of block `id` in layer `l`,
    plane `k` is at offset + l*layer_stride + k*kv_stride + id*block_stride. Defaults lay it out
    as [num_layers][kv_planes][num_blocks][block_bytes]."""

    def __new__(
        cls,
        region: Region,
        block_bytes: int,
        num_blocks: int,
        *,
        block_stride: Optional[int] = None,
        num_layers: int = 1,
        layer_stride: Optional[int] = None,
        kv_planes: int = 1,
        kv_stride: Optional[int] = None,
        offset: int = 0,
    ) -> KvLayout: ...
    @staticmethod
    def from_tensor(
        target: Union[Agent, Region],
        tensor: Any,
        *,
        block_dim: int = 0,
        kv_dim: Optional[int] = None,
        layer_dim: Optional[int] = None,
        pinned: Optional[bool] = None,
        read_only: bool = False,
    ) -> KvLayout:
        """The layout of a tensor whose leading dimensions are the block (and K/V, layer)
        dimensions and whose other dimensions are one contiguous block; registers it when
        `target` is an Agent."""
    @property
    def region(self) -> Region: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_stride(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def layer_stride(self) -> int: ...
    @property
    def kv_planes(self) -> int: ...
    @property
    def kv_stride(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def bytes_per_block(self) -> int: ...
    def block_offset(self, id: int, layer: int = 0, plane: int = 0) -> int: ...

@final
class PreparedBlocks:
    """A block transfer checked and planned once (agent.prepare_blocks), posted with new ids
    as often as needed."""

    def transfer(
        self, src_ids: Optional[_Ids] = None, dst_ids: Optional[_Ids] = None, *, timeout: Optional[float] = None
    ) -> Transfer: ...
    @property
    def plan(self) -> PlannedPair: ...
    @property
    def is_block_list(self) -> bool: ...
    @property
    def src(self) -> KvLayout: ...
    @property
    def dst(self) -> KvLayout: ...
    @property
    def method(self) -> Optional[str]: ...

@final
class TransferReport:
    bytes: int
    elapsed: float
    gbps: float
    pairs: List[PairReport]
    paths: List[str]

@final
class PlannedPair:
    index: int
    backend: str
    path: str
    finding: Optional[str]
    detail: Optional[str]

@final
class Transfer:
    def wait(self, timeout: Optional[float] = None) -> TransferReport: ...
    def done(self) -> bool: ...
    def cancel(self) -> None: ...
    @property
    def cancelled(self) -> bool: ...
    @property
    def report(self) -> Optional[TransferReport]: ...
    @property
    def plan(self) -> List[PlannedPair]: ...
    @property
    def id(self) -> int: ...
    @property
    def deadline_in(self) -> Optional[float]: ...
    @property
    def needs_progress(self) -> bool: ...
    def __await__(self) -> Generator[Any, None, TransferReport]: ...
    def _notify(self, waker: Waker, token: int) -> None: ...

@final
class Waker:
    def __new__(cls) -> Waker: ...
    def fileno(self) -> int: ...
    def drain(self) -> List[int]: ...
    def signal(self, token: int) -> None: ...

@final
class Server:
    @property
    def address(self) -> str: ...
    @property
    def peers(self) -> int: ...
    def next_event(self, timeout: float = 0.0) -> Optional[Tuple[str, str]]: ...
    def close(self, timeout: Optional[float] = None) -> int: ...
    def __enter__(self) -> Server: ...
    def __exit__(self, *exc: Any) -> None: ...

@final
class RemoteRegion:
    id: int
    kind: str
    len: int

@final
class Notification:
    sender: str
    message: bytes

@final
class Peer:
    @property
    def name(self) -> str: ...
    def regions(self) -> List[RemoteRegion]: ...
    def memory(self, id: int, offset: int = 0, length: Optional[int] = None) -> Region: ...
    @property
    def transport(self) -> str: ...
    @property
    def failure(self) -> Optional[str]: ...
    def notify(self, message: Union[bytes, bytearray, memoryview], timeout: float = 10.0) -> None: ...
    def flush(self, timeout: float = 10.0) -> None: ...
    def wait_for_region(self, id: int, timeout: float = 10.0) -> bool: ...
    def close(self, timeout: float = 10.0) -> None: ...
    def __enter__(self) -> Peer: ...
    def __exit__(self, *exc: Any) -> None: ...

@final
class TensorInfo:
    name: str
    dtype: str
    shape: List[int]
    nbytes: int
    file: int
    offset: int

@final
class DLPackView:
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __len__(self) -> int: ...
    @property
    def address(self) -> int: ...

@final
class LoadedCheckpoint:
    @property
    def tensors(self) -> List[TensorInfo]: ...
    def view(self, i: int) -> DLPackView: ...
    @property
    def region(self) -> Region: ...
    @property
    def path(self) -> Optional[str]: ...
    @property
    def chosen(self) -> Optional[str]: ...
    @property
    def finding(self) -> Optional[str]: ...
    @property
    def pairs(self) -> List[PairReport]: ...
    @property
    def tensor_bytes(self) -> int: ...
    @property
    def elapsed(self) -> float: ...
    @property
    def gbps(self) -> float: ...

@final
class Checkpoint:
    def __new__(cls, paths: Sequence[_Path]) -> Checkpoint: ...
    @staticmethod
    def open_index(index: _Path) -> Checkpoint: ...
    @staticmethod
    def open_paths(paths: Sequence[_Path]) -> Checkpoint: ...
    @property
    def files(self) -> List[Path]: ...
    def tensors(self) -> List[TensorInfo]: ...
    def metadata(self, file: int = 0) -> dict[str, str]: ...
    def load(
        self,
        agent: Optional[Agent] = None,
        *,
        gpu: Optional[int] = None,
        names: Optional[Sequence[str]] = None,
        pinned: bool = False,
        direct: Optional[bool] = None,
    ) -> LoadedCheckpoint: ...
    @staticmethod
    def save(
        agent: Agent,
        tensors: Sequence[Tuple[str, str, Sequence[int], Region, int, int]],
        path: _Path,
        *,
        metadata: Optional[Dict[str, str]] = None,
        overwrite: bool = True,
        fsync: bool = True,
    ) -> Dict[str, Any]: ...

def metrics_text() -> str: ...
def topo_json(
    *,
    snapshot: Optional[_Path] = None,
    sysfs_root: Optional[_Path] = None,
    hwloc_xml: Optional[_Path] = None,
    nccl_xml: Optional[_Path] = None,
    smi_topo: Optional[_Path] = None,
) -> str: ...
def doctor_json(
    *,
    snapshot: Optional[_Path] = None,
    sysfs_root: Optional[_Path] = None,
    hwloc_xml: Optional[_Path] = None,
    nccl_xml: Optional[_Path] = None,
    smi_topo: Optional[_Path] = None,
    paths: Optional[Sequence[_Path]] = None,
    measure: bool = False,
) -> Tuple[str, int]: ...
