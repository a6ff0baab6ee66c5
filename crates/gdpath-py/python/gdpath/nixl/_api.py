"""``nixl_agent`` and ``nixl_agent_config``: NIXL's Python API (``nixl._api``) on gdpath's engine.

The calls, arguments, handles, state strings (``"DONE"``, ``"PROC"``, ``"ERR"``) and exceptions
are NIXL's; underneath, a prepared descriptor list (``prep_xfer_dlist``) is cut into runs of
equal-length, evenly spaced descriptors inside one registered region, each run a
:class:`gdpath.KvLayout`, and ``make_prepped_xfer`` maps its indices to (run, block) in one
vectorised NumPy pass and becomes one prepared block transfer (``agent.prepare_blocks``) per
pair of runs it touches. A transfer's notification is sent after every block transfer of it
completed (and, for a WRITE, after the peer's connection was flushed), as NIXL promises.

Units: bytes, seconds. Differences from NIXL: ``docs/nixl.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import json
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import gdpath

from . import _bindings as nixlBind
from ._bindings import (
    DEFAULT_COMM_PORT,
    NIXL_INIT_AGENT,
    from_gdpath,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNotFoundError,
    nixlNotSupportedError,
    nixlRemoteDisconnectError,
    nixlRepostActiveError,
)

__all__ = [
    "DEFAULT_COMM_PORT",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_xfer_handle",
    "nixl_prepped_dlist_handle",
    "nixlRegDList",
    "nixlXferDList",
]

# The first line of a metadata blob; the rest is JSON (docs/nixl.md, "Metadata").
_MAGIC = b"gdpath.nixl/1\n"
# A blob larger than this is refused unread: 64 layers x K/V regions take a few KiB.
_MAX_BLOB = 1 << 20
_MAX_REGIONS = 65536
# Side-channel messages travel as gdpath notifications that start with these tags.
_MD_PUSH = b"\x00gdpath.nixl.md.push\x00"
_MD_FETCH = b"\x00gdpath.nixl.md.fetch\x00"
_MD_INVALIDATE = b"\x00gdpath.nixl.md.invalidate\x00"
# A request is posted as one prepared block transfer per pair of runs it touches while there
# are at most _MAX_GROUPS of them, or while they average at least _MIN_GROUP descriptors (a
# vLLM request touches every layer's K and V run: 160 groups for 80 layers, each as long as the
# request); otherwise (lists that do not form runs) as one engine post of descriptor pairs
# built in Rust from NumPy columns (``Agent.post_columns``), which costs per pair.
_MAX_GROUPS = 64
_MIN_GROUP = 16

_MEM_TYPES = {"DRAM": "DRAM", "VRAM": "VRAM", "FILE": "FILE", "cpu": "DRAM", "cuda": "VRAM"}
_UNSUPPORTED_MEM = {"BLOCK", "OBJ"}
_BACKENDS = ["UCX", "GDS"]


class nixl_agent_config:
    """How a :class:`nixl_agent` is made: NIXL's arguments, and gdpath's (keyword only).

    NIXL's: ``enable_prog_thread`` (completion is always driven by gdpath's threads: accepted
    for compatibility), ``enable_listen_thread`` (a thread handles side-channel metadata as it
    arrives; without it, it is handled inside ``get_new_notifs`` / ``check_remote_metadata``),
    ``listen_port`` (the port of gdpath's authenticated channel; 0 picks a free one),
    ``backends`` (``"UCX"``, ``"GDS"`` and ``"POSIX"`` map to gdpath's engine, which picks the
    path per transfer; others raise :class:`nixlNotSupportedError`), ``num_threads`` (threads
    that wait for transfers to complete and send their notifications; 0 means 4).

    gdpath's: ``token`` (str or bytes, at least 16 bytes: the shared secret of the channel;
    default ``$GDPATH_TOKEN``; required to listen off loopback), ``listen_addr`` (the host
    to listen on and to put in the metadata, default ``$GDPATH_NIXL_LISTEN`` or
    ``127.0.0.1``), ``net_devices`` (UCX devices, e.g. ``"lo"``), ``timeout`` (seconds: the
    deadline of every transfer, after which it is cancelled and its state is ``"ERR"``; None:
    no deadline beyond the engine's ``op_timeout``), ``op_timeout`` (seconds for one network
    operation before the peer is failed, default 60), ``connect_timeout`` (seconds, default
    10; also the deadline of ``fetch_remote_metadata``'s name resolution in a cluster).

    The etcd metadata path (docs/nixl.md, "etcd"): ``cluster`` (``etcd://host:port[,…]/ns``,
    gdpath's cluster URL, docs/cluster.md; default: NIXL's ``NIXL_ETCD_ENDPOINTS`` and
    ``NIXL_ETCD_NAMESPACE`` translated by :func:`etcd_url_from_env`), ``lease_ttl`` (seconds
    of the record's lease, default 10: a crashed agent is gone for its peers within it).
    """

    def __init__(
        self,
        enable_prog_thread: bool = True,
        enable_listen_thread: bool = False,
        listen_port: int = 0,
        backends: Optional[List[str]] = None,
        num_threads: int = 0,
        capture_telemetry: bool = False,
        *,
        token: Optional[Any] = None,
        listen_addr: Optional[str] = None,
        net_devices: Optional[str] = None,
        timeout: Optional[float] = None,
        op_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        cluster: Optional[str] = None,
        lease_ttl: float = 10.0,
    ):
        self.backends = list(backends) if backends is not None else ["UCX"]
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = int(listen_port)
        self.num_threads = int(num_threads)
        self.capture_telemetry = capture_telemetry
        self.token = token if token is not None else os.environ.get("GDPATH_TOKEN")
        self.listen_addr = listen_addr or os.environ.get("GDPATH_NIXL_LISTEN") or "127.0.0.1"
        self.net_devices = net_devices
        self.timeout = timeout
        self.op_timeout = op_timeout
        self.connect_timeout = connect_timeout
        self.cluster = cluster if cluster is not None else etcd_url_from_env()
        self.lease_ttl = lease_ttl


class _DList:
    """A descriptor list: ``descs`` is an N x 3 uint64 array of (address, length, device id)
    — for FILE, (offset, length, fd) —, all of memory type ``mem_type``."""

    def __init__(self, mem_type: str, descs: np.ndarray, metas: Optional[List[str]] = None):
        self.mem_type = mem_type
        self.descs = descs
        self.metas = metas if metas is not None else [""] * len(descs)
        # The objects the descriptors were made from (tensors), kept alive with the list.
        self.objs: List[Any] = []

    def getType(self) -> str:
        """The memory type: ``"DRAM"``, ``"VRAM"`` or ``"FILE"``."""
        return self.mem_type

    def descCount(self) -> int:
        """The number of descriptors."""
        return len(self.descs)

    def isEmpty(self) -> bool:
        """Whether the list has no descriptor."""
        return len(self.descs) == 0

    def __len__(self) -> int:
        return len(self.descs)

    def __getitem__(self, i: int) -> Tuple[int, int, int]:
        a, n, d = self.descs[i]
        return int(a), int(n), int(d)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.mem_type}, {len(self.descs)} descriptors)"


class nixlRegDList(_DList):
    """A registration descriptor list (``get_reg_descs``): what ``register_memory`` and
    ``deregister_memory`` take."""


class nixlXferDList(_DList):
    """A transfer descriptor list (``get_xfer_descs``): what ``prep_xfer_dlist`` and
    ``initialize_xfer`` take."""


class nixl_prepped_dlist_handle(int):
    """A prepared descriptor list's handle (an int, as NIXL's)."""


class nixl_xfer_handle(int):
    """A transfer's handle: an int, as NIXL's, that can also be awaited (``await handle``
    returns ``"DONE"`` or raises the NIXL exception of its failure), cancelled
    (``handle.cancel()``) and asked for its failure (``handle.error``, a NIXL exception
    carrying gdpath's ``kind``, ``finding`` and ``cause``)."""

    _xfer: "_Xfer"

    def __new__(cls, value: int, xfer: "_Xfer") -> "nixl_xfer_handle":
        h = super().__new__(cls, value)
        h._xfer = xfer
        return h

    def __await__(self):
        return self._xfer.wait_async().__await__()

    def cancel(self) -> None:
        """Cancels the posted transfer: no new I/O starts; its state becomes ``"ERR"``."""
        self._xfer.cancel()

    @property
    def error(self) -> Optional[BaseException]:
        """The NIXL exception of a failed transfer, or None."""
        return self._xfer.error

    @property
    def transfers(self) -> List[Any]:
        """The gdpath :class:`gdpath.Transfer` objects of the last post (one per pair of runs)."""
        return list(self._xfer.transfers)


# -- registered memory ---------------------------------------------------------------------


class _Mem:
    """One registered range: memory type, device (GPU ordinal; the fd for FILE), base address
    (offset 0 for FILE), length, the gdpath Region and its export id (None for FILE)."""

    __slots__ = ("mem_type", "dev", "base", "length", "region", "export_id")

    def __init__(self, mem_type: str, dev: int, base: int, length: int, region: Any, export_id: Optional[int]):
        self.mem_type, self.dev, self.base, self.length = mem_type, dev, base, length
        self.region, self.export_id = region, export_id


class _CudaSpan:
    """GPU memory given by address: what ``agent.register`` takes as
    ``__cuda_array_interface__`` (v3, bytes)."""

    def __init__(self, addr: int, length: int):
        self.__cuda_array_interface__ = {
            "shape": (length,),
            "typestr": "|u1",
            "data": (addr, False),
            "version": 3,
            "strides": None,
        }


class _Remote:
    """A remote agent added from its metadata: its name, gdpath Peer, address and regions
    (memory type, device, base, length, export id)."""

    def __init__(self, name: str, address: str, peer: Any, regions: List[Tuple[str, int, int, int, int]]):
        self.name, self.address, self.peer, self.regions = name, address, peer, regions
        self.views: Dict[int, Any] = {}

    def view(self, export_id: int) -> Any:
        r = self.views.get(export_id)
        if r is None:
            r = self.views[export_id] = self.peer.memory(export_id)
        return r


class _Table:
    """Regions of one memory type sorted by (device, base), for vectorised lookup."""

    def __init__(self, entries: List[Tuple[int, int, int, Any]]):
        entries = sorted(entries, key=lambda e: (e[0], e[1]))
        self.entries = entries
        self.devs = np.array([e[0] for e in entries], dtype=np.uint64)
        self.bases = np.array([e[1] for e in entries], dtype=np.uint64)
        self.ends = np.array([e[1] + e[2] for e in entries], dtype=np.uint64)

    def find(self, descs: np.ndarray) -> np.ndarray:
        """For each (address, length, device) row, the index of an entry containing it, or -1."""
        out = np.full(len(descs), -1, dtype=np.int64)
        if not self.entries or len(descs) == 0:
            return out
        addr, length, dev = descs[:, 0], descs[:, 1], descs[:, 2]
        for d in np.unique(dev):
            rows = np.flatnonzero(dev == d)
            lo = int(np.searchsorted(self.devs, d, "left"))
            hi = int(np.searchsorted(self.devs, d, "right"))
            if lo == hi:
                continue
            # The last region of this device starting at or before the address.
            k = np.searchsorted(self.bases[lo:hi], addr[rows], "right").astype(np.int64) - 1 + lo
            ok = k >= lo
            kk = np.where(ok, k, lo)
            end = addr[rows] + length[rows]
            ok &= (end >= addr[rows]) & (end <= self.ends[kk])
            out[rows] = np.where(ok, kk, -1)
        return out


class _Run:
    """Descriptors ``start .. start+count`` of a prepared list: one region, equal lengths,
    equal spacing: a KvLayout of ``count`` blocks."""

    __slots__ = ("layout", "length", "key")

    def __init__(self, layout: Any, length: int, key: Tuple[Any, ...]):
        self.layout, self.length, self.key = layout, length, key


class _Prepped:
    """A prepared descriptor list: whose (None = local), its memory type, descriptor count,
    and its runs (``starts``: the first index of each run, ascending)."""

    def __init__(self, agent_name: Optional[str], mem_type: str, n: int, starts: np.ndarray, runs: List[_Run], descs: np.ndarray, mems: List[Any], which: np.ndarray, offsets: np.ndarray):
        self.agent_name, self.mem_type, self.n = agent_name, mem_type, n
        self.starts, self.runs, self.descs, self.mems = starts, runs, descs, mems
        # Per descriptor: the index of its region in ``mems`` and its byte offset there (the
        # columns of a post of descriptor pairs).
        self.which, self.offsets = which, offsets


def _runs(descs: np.ndarray, where: np.ndarray) -> np.ndarray:
    """First indices of the runs of ``descs`` (rows of address, length, device; ``where`` the
    region of each), greedily longest first: a run is consecutive descriptors in one region,
    of one length, whose addresses step by one stride of at least that length (so that no
    two blocks overlap)."""
    n = len(descs)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    addr = descs[:, 0].astype(np.int64, copy=False)
    length = descs[:, 1].astype(np.int64, copy=False)
    step = np.diff(addr)
    ok = (where[1:] == where[:-1]) & (length[1:] == length[:-1]) & (step >= length[:-1]) & (length[:-1] > 0)
    # Where the stride changes between two steps that could both join a run: descriptor i+1
    # starts a new run unless descriptor i starts one itself (decided in order below, over
    # these places and the hard breaks only: few for the regular lists KV caches give).
    change = np.zeros(len(ok), dtype=bool)
    change[1:] = ok[:-1] & ok[1:] & (step[1:] != step[:-1])
    starts = [0]
    for i in np.flatnonzero(~ok | change).tolist():
        if not ok[i] or starts[-1] != i:
            starts.append(i + 1)
    return np.array(starts, dtype=np.int64)


def _ints(x: Any, what: str) -> np.ndarray:
    """``x`` (a list, range, NumPy array, torch CPU tensor) as a 1-D int64 array."""
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        dev = getattr(x, "device", None)
        if dev is not None and str(dev) != "cpu":
            raise nixlInvalidParamError(f"{what}: indices must be in host memory (pass .cpu())")
        try:
            x = np.from_dlpack(x)
        except Exception:
            x = np.asarray(x)
    a = np.asarray(x)
    if a.ndim != 1:
        raise nixlInvalidParamError(f"{what}: indices must be one-dimensional, not of shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(a.dtype, np.integer):
        raise nixlInvalidParamError(f"{what}: indices must be integers, not {a.dtype}")
    if a.dtype == np.uint64 and a.max() > np.iinfo(np.int64).max:
        bad = int(np.flatnonzero(a > np.iinfo(np.int64).max)[0])
        raise nixlInvalidParamError(f"{what}: index {int(a[bad])} at position {bad} is out of range")
    return a.astype(np.int64, copy=False)


def _message(msg: Any, what: str = "notif_msg") -> bytes:
    if isinstance(msg, str):
        return msg.encode()
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return bytes(msg)
    raise nixlInvalidParamError(f"{what} must be bytes or str, not {type(msg).__name__}")


class _Group:
    """One block transfer of a request: the prepared block transfer and its id arrays."""

    __slots__ = ("prepared", "src", "dst", "peer")

    def __init__(self, prepared: Any, src: np.ndarray, dst: np.ndarray, peer: Any):
        self.prepared, self.src, self.dst, self.peer = prepared, src, dst, peer


class _Xfer:
    """A transfer request (make_prepped_xfer / initialize_xfer) and its last post."""

    def __init__(self, agent: "nixl_agent", op: str, groups: List[_Group], pairs: Optional[Tuple[Any, ...]], remote: Optional[_Remote], notif: bytes, timeout: Optional[float]):
        self.agent, self.op, self.groups, self.pairs = agent, op, groups, pairs
        self.remote, self.notif, self.timeout = remote, notif, timeout
        self.state = "INIT"  # INIT (never posted), PROC, DONE, ERR
        self.transfers: List[Any] = []
        self.error: Optional[BaseException] = None
        self.future: Optional[concurrent.futures.Future] = None
        self.lock = threading.Lock()
        # Telemetry (get_xfer_telemetry): descriptors and bytes of the request, and of the last
        # post its start (µs since the epoch), the µs spent posting and to completion.
        if pairs is not None:
            self.ndesc, self.nbytes = len(pairs[-1]), int(pairs[-1].sum())
        else:
            self.ndesc = sum(len(g.src) for g in groups)
            self.nbytes = sum(len(g.src) * g.prepared.src.block_bytes for g in groups)
        self.start_us = self.post_us = self.xfer_us = 0
        self.t0 = 0.0

    def post(self, notif: bytes) -> str:
        with self.lock:
            if self.state == "PROC":
                raise nixlRepostActiveError("the transfer of this handle is still in flight")
            if notif:
                self.notif = notif
            self.error, self.transfers, self.state = None, [], "PROC"
            self.future = concurrent.futures.Future()
            self.start_us, self.t0 = int(time.time() * 1e6), time.perf_counter()
            self.post_us = self.xfer_us = 0
        try:
            if self.pairs is not None:
                self.transfers.append(self.agent._agent.post_columns(self.op.lower(), *self.pairs, timeout=self.timeout))
            else:
                for g in self.groups:
                    self.transfers.append(g.prepared.transfer(g.src, g.dst, timeout=self.timeout))
        except gdpath.GdpathError as e:
            for t in self.transfers:
                t.cancel()
            err = from_gdpath(e, "transfer")
            self._finish(err)
            raise err from e
        self.post_us = int((time.perf_counter() - self.t0) * 1e6)
        if all(t.done() for t in self.transfers):
            self._complete()
        else:
            self.agent._pool().submit(self._complete)
        return self.state

    def _complete(self) -> None:
        """Waits for every transfer of the post (each ends by its deadline or the engine's
        op_timeout), then sends the notification; runs on a pool thread or inline."""
        err: Optional[BaseException] = None
        for t in self.transfers:
            try:
                t.wait()
            except gdpath.GdpathError as e:
                err = err or from_gdpath(e, "transfer")
            except BaseException as e:  # noqa: BLE001 - reported as the transfer's failure
                err = err or nixlBind.nixlUnknownError(f"transfer: {e!r}", cause=e)
        if err is None and self.notif and self.remote is not None:
            try:
                if self.op == "WRITE":
                    # The writes visible at the peer before it reads the notification.
                    self.remote.peer.flush(self.agent._cfg.op_timeout)
                self.remote.peer.notify(self.notif, self.agent._cfg.op_timeout)
            except gdpath.GdpathError as e:
                err = from_gdpath(e, "notification")
        self._finish(err)

    def _finish(self, err: Optional[BaseException]) -> None:
        with self.lock:
            if self.state == "PROC":
                self.error = err
                self.state = "ERR" if err is not None else "DONE"
                self.xfer_us = int((time.perf_counter() - self.t0) * 1e6)
            fut = self.future
        if fut is not None and not fut.done():
            if err is None:
                fut.set_result("DONE")
            else:
                fut.set_exception(err)

    def cancel(self) -> None:
        for t in list(self.transfers):
            t.cancel()
        if self.state == "PROC" and not self.transfers:
            self._finish(nixlBind.nixlCancelledError("cancelled before any transfer was posted"))

    async def wait_async(self) -> str:
        if self.future is None:
            raise nixlBind.nixlNotPostedError("the transfer was never posted (call transfer(handle))")
        return await asyncio.wrap_future(self.future)


class nixl_agent:
    """A NIXL agent on gdpath: a :class:`gdpath.Agent` that serves gdpath's authenticated
    channel, registers and exports memory, and moves it with block transfers.

    ``agent_name`` must be unique among the agents that meet; ``nixl_conf`` a
    :class:`nixl_agent_config` (default: its defaults); ``instantiate_all`` is accepted for
    compatibility (gdpath's engine holds every backend the machine has). Raises
    :class:`nixlNotSupportedError` for a backend gdpath does not have, and gdpath's
    ``GdpathError`` (kind ``config``, ``net_devices``, ``ucx``) when the channel cannot be
    served.
    """

    def __init__(self, agent_name: str, nixl_conf: Optional[nixl_agent_config] = None, instantiate_all: bool = False):
        if not isinstance(agent_name, str) or not agent_name or agent_name == NIXL_INIT_AGENT:
            raise nixlInvalidParamError(f"agent name {agent_name!r} is not a usable name")
        cfg = nixl_conf or nixl_agent_config()
        unknown = [b for b in cfg.backends if b not in ("UCX", "GDS", "GDS_MT", "POSIX")]
        if unknown:
            raise nixlNotSupportedError(
                f"backend(s) {unknown} are not provided by gdpath (UCX, GDS, GDS_MT and POSIX map "
                "to its engine; docs/nixl.md, 'Not supported')"
            )
        self._cfg = cfg
        self._telemetry = bool(cfg.capture_telemetry) or os.environ.get("NIXL_TELEMETRY_ENABLE", "").lower() in ("y", "yes", "1", "true", "on")
        self.name = agent_name
        self.notifs: Dict[str, List[bytes]] = {}
        self.backends: Dict[str, int] = {b: i for i, b in enumerate(cfg.backends)}
        self.plugin_list = list(_BACKENDS)
        self._cluster = cfg.cluster
        if self._cluster:
            # A cluster member: the record is published by send_local_metadata, as NIXL
            # writes its etcd keys there, not at construction.
            try:
                self._agent = gdpath.Agent(name=agent_name, cluster=self._cluster, lease_ttl=cfg.lease_ttl)
            except gdpath.GdpathError as e:
                raise from_gdpath(e, f"cluster {self._cluster}") from e
        else:
            self._agent = gdpath.Agent(name=agent_name)
        self._agent.enable_net(
            devices=cfg.net_devices,
            op_timeout=cfg.op_timeout,
            connect_timeout=cfg.connect_timeout,
        )
        if self._cluster:
            self._server = self._agent.serve(f"{cfg.listen_addr}:{cfg.port}", token=cfg.token, publish=False)
        else:
            self._server = self._agent.serve(f"{cfg.listen_addr}:{cfg.port}", token=cfg.token)
        self._lock = threading.RLock()
        self._mems: List[_Mem] = []
        self._tables: Dict[str, _Table] = {}
        self._remotes: Dict[str, _Remote] = {}
        self._remote_tables: Dict[str, Dict[str, _Table]] = {}
        self._prepped: Dict[int, _Prepped] = {}
        self._xfers: Dict[int, _Xfer] = {}
        self._blocks: Dict[Tuple[Any, ...], Any] = {}
        self._next = 1
        self._inbox: List[Any] = []
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._listener: Optional[threading.Thread] = None
        self._closed = threading.Event()
        # Cluster peers found by name (fetch_remote_metadata), watched for their record going.
        self._cluster_peers: Dict[str, Any] = {}
        if cfg.enable_listen:
            self._listener = threading.Thread(target=self._listen, name=f"nixl-listen-{agent_name}", daemon=True)
            self._listener.start()
        if self._cluster:
            self._cluster_start()

    # -- plugins and backends (gdpath's engine has them all; kept for NIXL's callers) --------

    def get_plugin_list(self) -> List[str]:
        """The NIXL backend names gdpath's engine stands in for: ``["UCX", "GDS"]``."""
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend: str) -> List[str]:
        """Memory types of ``backend``: DRAM and VRAM for UCX, plus FILE for GDS."""
        return ["DRAM", "VRAM", "FILE"] if backend in ("GDS", "GDS_MT", "POSIX") else ["DRAM", "VRAM"]

    def get_plugin_params(self, backend: str) -> Dict[str, str]:
        """No initialisation parameters: gdpath's engine takes its settings from the machine."""
        return {}

    def get_backend_mem_types(self, backend: str) -> List[str]:
        """As :meth:`get_plugin_mem_types`."""
        return self.get_plugin_mem_types(backend)

    def get_backend_params(self, backend: str) -> Dict[str, str]:
        """No parameters (see :meth:`get_plugin_params`)."""
        return {}

    def create_backend(self, backend: str, initParams: Optional[Dict[str, str]] = None) -> None:
        """Accepts UCX, GDS, GDS_MT and POSIX (the engine picks the path per transfer);
        raises :class:`nixlNotSupportedError` for any other backend."""
        if backend not in ("UCX", "GDS", "GDS_MT", "POSIX"):
            raise nixlNotSupportedError(f"backend {backend!r} is not provided by gdpath (docs/nixl.md)")
        self.backends.setdefault(backend, len(self.backends))

    # -- descriptor lists ------------------------------------------------------------------

    def _mem_type(self, mem_type: Optional[str]) -> str:
        if mem_type in _UNSUPPORTED_MEM:
            raise nixlNotSupportedError(f"memory type {mem_type} is not supported by gdpath (docs/nixl.md)")
        m = _MEM_TYPES.get(mem_type or "")
        if m is None:
            raise nixlInvalidParamError(f"unknown memory type {mem_type!r} (DRAM, VRAM, FILE)")
        return m

    def _descs(self, descs: Any, mem_type: Optional[str], width: int, cls: type) -> _DList:
        """A descriptor list from NIXL's inputs (see get_xfer_descs / get_reg_descs)."""
        if isinstance(descs, _DList):
            if not isinstance(descs, cls):
                raise nixlInvalidParamError(f"a {type(descs).__name__} where a {cls.__name__} is needed")
            return descs
        if isinstance(descs, np.ndarray):
            if descs.ndim != 2 or descs.shape[1] != 3 or not np.issubdtype(descs.dtype, np.integer):
                raise nixlInvalidParamError(f"a NumPy descriptor array must be N x 3 integers, not {descs.shape} {descs.dtype}")
            if (descs < 0).any():
                raise nixlInvalidParamError("a NumPy descriptor array holds a negative value")
            return cls(self._mem_type(mem_type), np.ascontiguousarray(descs, dtype=np.uint64))
        tensors = [descs] if _is_tensor(descs) else (list(descs) if isinstance(descs, (list, tuple)) and descs and _is_tensor(descs[0]) else None)
        if tensors is not None:
            devs = {str(t.device) for t in tensors}
            if len(devs) != 1:
                raise nixlInvalidParamError(f"tensors on several devices ({sorted(devs)}) in one list")
            mt = "VRAM" if next(iter(devs)).startswith("cuda") else "DRAM"
            rows = [(t.data_ptr(), t.numel() * t.element_size(), max(t.get_device(), 0)) for t in tensors]
            out = cls(mt, np.array(rows, dtype=np.uint64).reshape(-1, 3))
            out.objs = tensors
            return out
        if isinstance(descs, (list, tuple)):
            if mem_type is None:
                raise nixlInvalidParamError("a list of descriptor tuples needs mem_type (DRAM, VRAM, FILE)")
            mt = self._mem_type(mem_type)
            rows = []
            metas = []
            for i, d in enumerate(descs):
                if not isinstance(d, (tuple, list)) or len(d) not in (3, 4) or (width == 3 and len(d) != 3):
                    raise nixlInvalidParamError(f"descriptor {i} must be a tuple (addr, len, dev_id{', meta' if width == 4 else ''}), not {d!r}")
                try:
                    a, n, dv = (int(v) for v in d[:3])
                except (TypeError, ValueError):
                    raise nixlInvalidParamError(f"descriptor {i} holds a value that is not an integer: {d!r}") from None
                if min(a, n, dv) < 0 or max(a, n, dv) >= 1 << 64:
                    raise nixlInvalidParamError(f"descriptor {i} is out of range: {d!r}")
                rows.append((a, n, dv))
                metas.append(str(d[3]) if len(d) == 4 else "")
            return cls(mt, np.array(rows, dtype=np.uint64).reshape(-1, 3), metas)
        raise nixlInvalidParamError(f"cannot make descriptors of {type(descs).__name__}")

    def get_xfer_descs(self, descs: Any, mem_type: Optional[str] = None, is_sorted: bool = False) -> nixlXferDList:
        """A transfer descriptor list from a tensor, a list of tensors, a list of
        ``(addr, len, dev_id)`` tuples or an N x 3 integer NumPy array (with ``mem_type``),
        or a :class:`nixlXferDList` as it is. Raises :class:`nixlInvalidParamError`."""
        return self._descs(descs, mem_type, 3, nixlXferDList)  # type: ignore[return-value]

    def get_reg_descs(self, descs: Any, mem_type: Optional[str] = None, is_sorted: bool = False) -> nixlRegDList:
        """A registration descriptor list from a tensor, a list of tensors, a list of
        ``(addr, len, dev_id, meta)`` tuples or an N x 3 NumPy array (with ``mem_type``), or
        a :class:`nixlRegDList` as it is. For FILE, ``(offset, len, fd, path)``."""
        return self._descs(descs, mem_type, 4, nixlRegDList)  # type: ignore[return-value]

    # -- registration ----------------------------------------------------------------------

    def register_memory(self, reg_list: Any, mem_type: Optional[str] = None, is_sorted: bool = False, backends: Sequence[str] = ()) -> nixlRegDList:
        """Registers every descriptor with gdpath's agent (in place: tensors through DLPack,
        host memory by address, GPU memory by address through ``__cuda_array_interface__``,
        files by path) and exports it to the peers of the channel; returns the list. Memory
        given by address must outlive its registration (as with NIXL). Raises
        :class:`nixlInvalidParamError` for bad descriptors and gdpath's refusal as its NIXL
        class (``unsupported``: VRAM without a CUDA driver); nothing stays registered then."""
        reg = self.get_reg_descs(reg_list, mem_type, is_sorted)
        added: List[_Mem] = []
        try:
            for i in range(len(reg)):
                a, n, dv = reg[i]
                added.append(self._register_one(reg, i, a, n, dv))
        except BaseException:
            for m in added:
                self._drop(m)
            raise
        with self._lock:
            self._mems.extend(added)
            self._tables.pop(reg.mem_type, None)
        return reg

    def _register_one(self, reg: _DList, i: int, a: int, n: int, dv: int) -> _Mem:
        mt = reg.mem_type
        if n == 0:
            raise nixlInvalidParamError(f"descriptor {i} has length 0")
        try:
            if mt == "FILE":
                path = reg.metas[i] or os.readlink(f"/proc/self/fd/{dv}")
                region = self._agent.register(gdpath.File(path, "r+"))
                if a + n > len(region):
                    self._agent.deregister(region)
                    raise nixlInvalidParamError(f"descriptor {i} reaches past the end of {path!r} ({len(region)} bytes)")
                return _Mem(mt, dv, 0, len(region), region, None)
            obj = reg.objs[i] if reg.objs else None
            if obj is not None:
                region = self._agent.register(obj)
            elif mt == "DRAM":
                region = self._agent.register((ctypes.c_char * n).from_address(a))
            else:
                region = self._agent.register(_CudaSpan(a, n), gpu=dv)
            export_id = self._agent.export(region)
            return _Mem(mt, dv, a, n, region, export_id)
        except gdpath.GdpathError as e:
            raise from_gdpath(e, f"register descriptor {i}") from e
        except OSError as e:
            raise nixlInvalidParamError(f"descriptor {i}: {e}") from e

    def _drop(self, m: _Mem) -> None:
        if m.export_id is not None:
            self._agent.unexport(m.region)
        self._agent.deregister(m.region)

    def deregister_memory(self, dereg_list: nixlRegDList, backends: Sequence[str] = ()) -> None:
        """Withdraws and deregisters memory that ``register_memory`` registered (matched by
        address, length and device). Raises :class:`nixlNotFoundError` for memory not
        registered, :class:`nixlNotAllowedError` while a transfer uses it."""
        if not isinstance(dereg_list, nixlRegDList):
            raise nixlInvalidParamError("deregister_memory takes the nixlRegDList that register_memory returned")
        with self._lock:
            found = []
            for i in range(len(dereg_list)):
                a, n, dv = dereg_list[i]
                m = next((m for m in self._mems if m.mem_type == dereg_list.mem_type and m.dev == dv and (m.base, m.length) == ((0 if m.mem_type == "FILE" else a), (m.length if m.mem_type == "FILE" else n)) and m not in found), None)
                if m is None:
                    raise nixlNotFoundError(f"descriptor {i} ({a:#x}, {n}, {dv}) is not registered")
                found.append(m)
            for m in found:
                try:
                    self._drop(m)
                except gdpath.GdpathError as e:
                    raise from_gdpath(e, "deregister") from e
                self._mems.remove(m)
            self._tables.pop(dereg_list.mem_type, None)

    def query_memory(self, reg_list: Any, backend: str = "GDS", mem_type: Optional[str] = None) -> List[Optional[Dict[str, Any]]]:
        """For FILE descriptors ``(offset, len, fd, path)``: per descriptor ``None`` where the
        file (its path, else its fd) does not exist, else ``{"size": bytes, "mode": st_mode,
        "mtime": seconds}``. Raises :class:`nixlNotSupportedError` for other memory types."""
        reg = self.get_reg_descs(reg_list, mem_type or "FILE")
        if reg.mem_type != "FILE":
            raise nixlNotSupportedError("query_memory answers for FILE descriptors only")
        out: List[Optional[Dict[str, Any]]] = []
        for i in range(len(reg)):
            _, _, fd = reg[i]
            try:
                st = os.stat(reg.metas[i]) if reg.metas[i] else os.fstat(fd)
            except OSError:
                out.append(None)
                continue
            out.append({"size": st.st_size, "mode": st.st_mode, "mtime": st.st_mtime})
        return out

    def _local_table(self, mem_type: str) -> _Table:
        t = self._tables.get(mem_type)
        if t is None:
            t = self._tables[mem_type] = _Table([(m.dev, m.base, m.length, m) for m in self._mems if m.mem_type == mem_type])
        return t

    # -- metadata --------------------------------------------------------------------------

    def get_agent_metadata(self) -> bytes:
        """What a peer needs to connect and address this agent's exported memory: name,
        channel address and (memory type, device, base, length, export id) per region. It
        holds no secret: a peer must also hold the channel's token (docs/nixl.md)."""
        with self._lock:
            regions = [[m.mem_type, m.dev, m.base, m.length, m.export_id] for m in self._mems if m.export_id is not None]
        body = {"name": self.name, "address": self._server.address, "regions": regions}
        return _MAGIC + json.dumps(body, separators=(",", ":")).encode()

    def get_partial_agent_metadata(self, descs: Any = None, inc_conn_info: bool = False, backends: Sequence[str] = ()) -> bytes:
        """The full metadata (gdpath sends every exported region; the peer's channel checks
        access)."""
        return self.get_agent_metadata()

    def add_remote_agent(self, metadata: bytes) -> str:
        """Connects to the agent ``metadata`` describes through gdpath's authenticated channel
        (this agent's token) and returns its name. Raises :class:`nixlInvalidParamError` for a
        blob that is not gdpath.nixl metadata, :class:`nixlRemoteDisconnectError` when the
        connection or its authentication fails, :class:`nixlMismatchError` when the
        authenticated peer's name is not the one the blob claims."""
        name, address, regions = _parse_blob(metadata)
        if name == self.name:
            raise nixlInvalidParamError("the metadata is this agent's own")
        with self._lock:
            old = self._remotes.get(name)
            if old is not None and old.address == address and old.peer.failure is None:
                old.regions = regions
                self._remote_tables.pop(name, None)
                return name
        try:
            peer = self._cluster_connection(name)
            if peer is None:
                peer = self._agent.connect(address, token=self._cfg.token, timeout=self._cfg.connect_timeout)
        except gdpath.GdpathError as e:
            raise from_gdpath(e, f"connect to {name!r} at {address}") from e
        if _sender_name(peer.name) != name:
            peer.close()
            raise nixlMismatchError(f"the agent at {address} is {_sender_name(peer.name)!r}, not {name!r} as its metadata says")
        with self._lock:
            if old is not None:
                old.peer.close()
            self._remotes[name] = _Remote(name, address, peer, regions)
            self._remote_tables.pop(name, None)
        return name

    def remove_remote_agent(self, agent: str) -> None:
        """Disconnects from ``agent``; later calls naming it raise :class:`nixlNotFoundError`."""
        with self._lock:
            r = self._remotes.pop(agent, None)
            self._remote_tables.pop(agent, None)
            self._cluster_peers.pop(agent, None)
        if r is None:
            raise nixlNotFoundError(f"no remote agent {agent!r}")
        r.peer.close()

    def make_connection(self, remote_agent: str, backends: Sequence[str] = ()) -> None:
        """The connection is made by ``add_remote_agent``: checks it is there and alive."""
        r = self._remote(remote_agent)
        if r.peer.failure is not None:
            raise nixlRemoteDisconnectError(f"the connection to {remote_agent!r} failed: {r.peer.failure}")

    def _remote(self, name: str) -> _Remote:
        r = self._remotes.get(name)
        if r is None:
            raise nixlNotFoundError(f"no remote agent {name!r} (add_remote_agent first)")
        return r

    def _remote_table(self, name: str, mem_type: str) -> _Table:
        r = self._remote(name)
        tabs = self._remote_tables.setdefault(name, {})
        t = tabs.get(mem_type)
        if t is None:
            t = tabs[mem_type] = _Table([(dv, base, n, eid) for (mt, dv, base, n, eid) in r.regions if mt == mem_type])
        return t

    # -- side channel (gdpath's authenticated channel carries NIXL's metadata messages) ------

    def _side_peer(self, ip_addr: str, port: int) -> Any:
        if not ip_addr:
            raise nixlNotSupportedError("a metadata server (ip_addr empty: etcd) is not provided here; name the peer's ip_addr")
        try:
            return self._agent.connect(f"{ip_addr}:{port}", token=self._cfg.token, timeout=self._cfg.connect_timeout)
        except gdpath.GdpathError as e:
            raise from_gdpath(e, f"side channel to {ip_addr}:{port}") from e

    def _side_send(self, ip_addr: str, port: int, message: bytes, what: str) -> None:
        """Sends one side-channel message to the agent at ``ip_addr:port`` and disconnects."""
        peer = self._side_peer(ip_addr, port)
        try:
            peer.notify(message, self._cfg.op_timeout)
        except gdpath.GdpathError as e:
            raise from_gdpath(e, what) from e
        finally:
            peer.close()

    def send_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        """Sends this agent's metadata to the agent serving at ``ip_addr:port`` (its
        ``listen_port``), which adds it (in its listener thread, or at its next
        ``get_new_notifs`` / ``check_remote_metadata``). Without ``ip_addr`` on an agent in a
        cluster: publishes its record in etcd (docs/nixl.md, "etcd"); errors then are
        :class:`nixlNotAllowedError` (the name is held by another live agent) and
        :class:`nixlBackendError` (etcd unreachable or denying)."""
        if not ip_addr and self._cluster:
            self._cluster_publish()
            return
        self._side_send(ip_addr, port, _MD_PUSH + self.get_agent_metadata(), "send_local_metadata")

    def send_partial_agent_metadata(self, descs: Any = None, inc_conn_info: bool = False, backends: Sequence[str] = (), ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        """As :meth:`send_local_metadata` (the whole metadata)."""
        self.send_local_metadata(ip_addr, port)

    def fetch_remote_metadata(self, remote_agent: str, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        """Asks the agent serving at ``ip_addr:port`` for its metadata; it answers with
        :meth:`send_local_metadata` to this agent, and :meth:`check_remote_metadata` then says
        True. The request carries this agent's metadata, so that the answer can be sent.

        Without ``ip_addr`` on an agent in a cluster: resolves ``remote_agent`` in etcd,
        waiting up to ``connect_timeout`` seconds for its record (then
        :class:`nixlNotFoundError`), connects through gdpath's authenticated channel (this
        agent's token; a wrong one raises :class:`nixlRemoteDisconnectError`) and asks the
        agent for its metadata over it; :meth:`check_remote_metadata` says True once it
        arrived."""
        if not ip_addr and self._cluster:
            self._cluster_fetch(remote_agent)
            return
        self._side_send(ip_addr, port, _MD_FETCH + self.get_agent_metadata(), "fetch_remote_metadata")

    def invalidate_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        """Tells the agent at ``ip_addr:port`` to forget this agent (it removes it). Without
        ``ip_addr`` on an agent in a cluster: withdraws its record (the lease revoked), so that
        every agent that fetched it sees it gone, its transfers to it ending ``"ERR"``."""
        if not ip_addr and self._cluster:
            try:
                self._agent.cluster_leave()
            except gdpath.GdpathError as e:
                raise from_gdpath(e, "invalidate_local_metadata") from e
            return
        self._side_send(ip_addr, port, _MD_INVALIDATE + self.name.encode(), "invalidate_local_metadata")

    def check_remote_metadata(self, agent: str, descs: Any = None) -> bool:
        """Whether ``agent``'s metadata was added (and, with ``descs``, covers them). In a
        cluster, False once the agent's record went (it must be fetched again)."""
        self._cluster_reap()
        self._pump()
        if agent not in self._remotes:
            return False
        if descs is not None:
            d = self.get_xfer_descs(descs)
            return bool((self._remote_table(agent, d.mem_type).find(d.descs) >= 0).all())
        return True

    def _handle_control(self, sender: str, message: bytes) -> bool:
        """Handles a side-channel message; False for a user notification."""
        if not message.startswith(b"\x00gdpath.nixl.md."):
            return False
        try:
            if message.startswith((_MD_PUSH, _MD_FETCH)):
                tag = _MD_PUSH if message.startswith(_MD_PUSH) else _MD_FETCH
                blob = message[len(tag):]
                # Only an agent's own metadata is taken from it: a blob naming another agent
                # would replace that agent's region table without its authenticated connection.
                if _parse_blob(blob)[0] != _sender_name(sender):
                    return True
                name = self.add_remote_agent(blob)
                if tag == _MD_FETCH:
                    self._remotes[name].peer.notify(_MD_PUSH + self.get_agent_metadata(), self._cfg.op_timeout)
            elif message.startswith(_MD_INVALIDATE):
                name = message[len(_MD_INVALIDATE):].decode("utf-8", "replace")
                # Only the agent itself may withdraw its metadata.
                if name == _sender_name(sender) and name in self._remotes:
                    self.remove_remote_agent(name)
        except (gdpath.GdpathError, nixlBind.nixlError):
            pass  # a bad or unreachable peer's message changes nothing here
        return True

    def _pump(self) -> None:
        """Moves arrived notifications into the inbox, handling side-channel messages."""
        for n in self._agent.take_notifications():
            if not self._handle_control(n.sender, n.message):
                with self._lock:
                    self._inbox.append(n)

    def _listen(self) -> None:
        while not self._closed.is_set():
            try:
                n = self._agent.wait_notification(0.2)
            except Exception:
                return
            if n is not None and not self._handle_control(n.sender, n.message):
                with self._lock:
                    self._inbox.append(n)

    # -- the etcd metadata path (gdpath's cluster; docs/nixl.md, "etcd") -------------------

    def _cluster_start(self) -> None:
        # Peers fetch this agent's metadata from the agent itself over the channel, so their
        # requests are answered as they arrive, listener thread asked for or not.
        if self._listener is None:
            self._listener = threading.Thread(target=self._listen, name=f"nixl-listen-{self.name}", daemon=True)
            self._listener.start()
        threading.Thread(target=self._cluster_watch, name=f"nixl-cluster-{self.name}", daemon=True).start()

    def _cluster_publish(self) -> None:
        try:
            self._agent.cluster_publish()
        except gdpath.GdpathError as e:
            if getattr(e, "kind", None) == "name_taken":
                raise nixlBind.nixlNotAllowedError(f"send_local_metadata: {e}", e.kind, getattr(e, "finding", None), cause=e) from e
            raise from_gdpath(e, "send_local_metadata") from e

    def _cluster_fetch(self, name: str) -> None:
        if name == self.name:
            raise nixlInvalidParamError("fetch_remote_metadata: that is this agent's own name")
        with self._lock:
            known = self._cluster_peers.get(name)
            if known is not None and known.gone is None and name in self._remotes:
                return
        deadline = self._cfg.connect_timeout
        try:
            cp = self._agent.peer(name, token=self._cfg.token, timeout=deadline)
        except gdpath.GdpathError as e:
            if getattr(e, "kind", None) == "not_found":
                raise nixlNotFoundError(
                    f"fetch_remote_metadata: no agent {name!r} in the cluster within {deadline} s", e.kind, getattr(e, "finding", None), cause=e
                ) from e
            raise from_gdpath(e, f"fetch_remote_metadata {name!r}") from e
        with self._lock:
            old = self._remotes.get(name)
            self._cluster_peers[name] = cp
        if old is not None and old.peer is not cp.peer:
            # Metadata of another incarnation (or another channel) is never used again.
            self._cluster_forget(name, old, f"replaced by incarnation {cp.incarnation}")
        try:
            cp.peer.notify(_MD_FETCH + self.get_agent_metadata(), self._cfg.op_timeout)
        except gdpath.GdpathError as e:
            raise from_gdpath(e, f"fetch_remote_metadata {name!r}") from e

    def _cluster_connection(self, name: str) -> Any:
        """The channel to ``name`` made when it was resolved in the cluster, while its record
        stands; None otherwise (add_remote_agent then connects by address)."""
        cp = self._cluster_peers.get(name)
        if cp is None or cp.gone is not None or cp.peer.failure is not None:
            return None
        return cp.peer

    def _cluster_forget(self, name: str, r: _Remote, why: str) -> None:
        """Ends every transfer to ``r`` in ``"ERR"`` and forgets it."""
        err = nixlRemoteDisconnectError(f"remote agent {name!r} is gone: {why}", "peer_gone")
        with self._lock:
            if self._remotes.get(name) is r:
                del self._remotes[name]
                self._remote_tables.pop(name, None)
            xfers = [x for x in self._xfers.values() if x.remote is r and x.state == "PROC"]
        for x in xfers:
            x._finish(err)
            x.cancel()
        try:
            r.peer.close(0.1)
        except gdpath.GdpathError:
            pass

    def _cluster_reap(self) -> None:
        """Forgets every cluster peer whose record went (lease expired, left, replaced)."""
        for name, cp in list(self._cluster_peers.items()):
            gone = cp.gone
            if gone is None:
                continue
            with self._lock:
                if self._cluster_peers.get(name) is cp:
                    del self._cluster_peers[name]
                r = self._remotes.get(name)
            if r is not None and r.peer is cp.peer:
                self._cluster_forget(name, r, f"incarnation {cp.incarnation}: {gone[1]}")

    def _cluster_watch(self) -> None:
        # ClusterPeer.gone is set by the cluster's watch; polling it every 50 ms bounds the
        # delay to "ERR" by the lease TTL plus that.
        while not self._closed.wait(0.05):
            try:
                self._cluster_reap()
            except Exception:  # noqa: BLE001 - the watch must outlive one bad peer
                pass

    # -- prepared lists and transfers ------------------------------------------------------

    def prep_xfer_dlist(self, agent_name: str, xfer_list: Any, mem_type: Optional[str] = None, is_sorted: bool = False, backends: Sequence[str] = ()) -> nixl_prepped_dlist_handle:
        """Prepares descriptors once for :meth:`make_prepped_xfer`: ``"NIXL_INIT_AGENT"`` (or
        ``""``) for the local side, a remote agent's name for its memory, this agent's own name
        for a loopback target. Every descriptor is checked against the registered memory
        (local) or the remote agent's metadata here, once. Raises
        :class:`nixlNotFoundError` for an unknown agent or memory not registered there."""
        d = self.get_xfer_descs(xfer_list, mem_type, is_sorted)
        local = agent_name in (NIXL_INIT_AGENT, "") or agent_name == self.name
        with self._lock:
            if local:
                table = self._local_table(d.mem_type)
            else:
                table = self._remote_table(agent_name, d.mem_type)
        where = table.find(d.descs)
        if (where < 0).any():
            bad = int(np.flatnonzero(where < 0)[0])
            a, n, dv = d[bad]
            whose = "this agent" if local else f"agent {agent_name!r}'s metadata"
            raise nixlNotFoundError(f"descriptor {bad} ({a:#x}, {n}, {dv}) of {d.mem_type} is not registered in {whose}")
        starts = _runs(d.descs, where)
        ends = np.append(starts[1:], len(d.descs))
        runs = []
        mems = []
        remote = None if local else self._remote(agent_name)
        # Regions the list touches, and each descriptor's region among them and offset in it.
        used, which = np.unique(where, return_inverse=True)
        bases = np.array([table.entries[int(k)][1] for k in used], dtype=np.uint64)
        offsets = d.descs[:, 0] - bases[which]
        for s, e in zip(starts.tolist(), ends.tolist()):
            entry = table.entries[int(where[s])]
            a, n, _ = d[s]
            stride = int(d.descs[s + 1, 0] - d.descs[s, 0]) if e - s > 1 else n
            if remote is None:
                m: _Mem = entry[3]
                region = m.region
                key: Tuple[Any, ...] = ("local", id(m))
            else:
                region = remote.view(entry[3])
                key = ("remote", agent_name, entry[3])
            base = entry[1]
            try:
                layout = gdpath.KvLayout(region, n, e - s, block_stride=stride, offset=a - base)
            except gdpath.GdpathError as exc:
                raise from_gdpath(exc, f"descriptors {s}..{e}") from exc
            runs.append(_Run(layout, n, key + (a - base, n, stride, e - s)))
        for k in used.tolist():
            entry = table.entries[int(k)]
            mems.append(entry[3].region if remote is None else remote.view(entry[3]))
        p = _Prepped(None if agent_name in (NIXL_INIT_AGENT, "") else agent_name, d.mem_type, len(d.descs), starts, runs, d.descs, mems, which.astype(np.int64), offsets)
        with self._lock:
            h = self._next
            self._next += 1
            self._prepped[h] = p
        return nixl_prepped_dlist_handle(h)

    def release_dlist_handle(self, handle: int) -> None:
        """Releases a prepared list; later use of the handle raises :class:`nixlNotFoundError`
        (transfers made from it keep what they need)."""
        with self._lock:
            if self._prepped.pop(int(handle), None) is None:
                raise nixlNotFoundError(f"no prepared descriptor list {int(handle)} (released?)")

    def _prepped_of(self, handle: int, what: str) -> _Prepped:
        p = self._prepped.get(int(handle)) if isinstance(handle, (int, np.integer)) else None
        if p is None:
            raise nixlNotFoundError(f"{what}: no prepared descriptor list {handle!r} (released?)")
        return p

    def make_prepped_xfer(
        self,
        operation: str,
        local_xfer_side: int,
        local_indices: Any,
        remote_xfer_side: int,
        remote_indices: Any,
        notif_msg: Any = b"",
        backends: Sequence[str] = (),
        skip_desc_merge: bool = False,
        *,
        timeout: Optional[float] = None,
    ) -> nixl_xfer_handle:
        """A transfer of local descriptor ``local_indices[i]`` with remote descriptor
        ``remote_indices[i]`` (``"READ"``: remote to local; ``"WRITE"``: local to remote),
        posted by :meth:`transfer`. The indices are checked in one vectorised pass (a list,
        range, NumPy array or torch CPU tensor); ``notif_msg`` reaches the remote agent after
        the data. ``timeout`` (gdpath; seconds): the deadline of each post, default the
        config's. Raises :class:`nixlInvalidParamError` (op, indices, counts),
        :class:`nixlNotFoundError` (handles), :class:`nixlMismatchError` (lengths, types)."""
        op = _op(operation)
        loc = self._prepped_of(local_xfer_side, "local_xfer_side")
        rem = self._prepped_of(remote_xfer_side, "remote_xfer_side")
        if loc.agent_name is not None:
            raise nixlInvalidParamError("local_xfer_side must be prepared with NIXL_INIT_AGENT")
        if rem.agent_name is None:
            raise nixlInvalidParamError("remote_xfer_side must be prepared with a remote (or this) agent's name")
        li = _ints(local_indices, "local_indices")
        ri = _ints(remote_indices, "remote_indices")
        if len(li) != len(ri):
            raise nixlInvalidParamError(f"{len(li)} local indices but {len(ri)} remote indices")
        if len(li) == 0:
            raise nixlInvalidParamError("no descriptor to transfer (empty indices)")
        for side, idx, p in (("local", li, loc), ("remote", ri, rem)):
            bad = (idx < 0) | (idx >= p.n)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                raise nixlInvalidParamError(f"{side} index {int(idx[k])} at position {k} is out of range (the list has {p.n} descriptors)")
        remote = None if rem.agent_name == self.name else self._remote(rem.agent_name)
        return self._make(op, loc, li, rem, ri, remote, _message(notif_msg), timeout)

    def _make(self, op: str, loc: _Prepped, li: np.ndarray, rem: _Prepped, ri: np.ndarray, remote: Optional[_Remote], notif: bytes, timeout: Optional[float]) -> nixl_xfer_handle:
        sl = np.searchsorted(loc.starts, li, "right") - 1
        sr = np.searchsorted(rem.starts, ri, "right") - 1
        key = sl * len(rem.starts) + sr
        cut = np.flatnonzero(key[1:] != key[:-1]) + 1
        firsts = np.concatenate(([0], cut))
        if len(np.unique(key[firsts])) != len(firsts):
            # A pair of runs met again later: group by it (stable, so block order is kept).
            order = np.argsort(key, kind="stable")
            li, ri, sl, sr, key = li[order], ri[order], sl[order], sr[order], key[order]
            cut = np.flatnonzero(key[1:] != key[:-1]) + 1
            firsts = np.concatenate(([0], cut))
        bounds = np.append(firsts, len(key))
        if len(firsts) > _MAX_GROUPS and len(key) < _MIN_GROUP * len(firsts):
            pairs = self._pairs(loc, li, rem, ri)
            x = _Xfer(self, op, [], pairs, remote, notif, timeout if timeout is not None else self._cfg.timeout)
            return self._handle(x)
        groups = []
        pos_l = li - loc.starts[sl]
        pos_r = ri - rem.starts[sr]
        for b in range(len(firsts)):
            s, e = int(bounds[b]), int(bounds[b + 1])
            rl, rr = loc.runs[int(sl[s])], rem.runs[int(sr[s])]
            if rl.length != rr.length:
                raise nixlMismatchError(f"local descriptor {int(li[s])} is {rl.length} bytes, remote descriptor {int(ri[s])} is {rr.length}")
            src, dst = (rr, rl) if op == "READ" else (rl, rr)
            prepared = self._prepare(src, dst)
            if prepared is None:
                # Two runs of one region (NIXL allows it, a block transfer does not): pairs.
                x = _Xfer(self, op, [], self._pairs(loc, li, rem, ri), remote, notif, timeout if timeout is not None else self._cfg.timeout)
                return self._handle(x)
            ids_src, ids_dst = (pos_r[s:e], pos_l[s:e]) if op == "READ" else (pos_l[s:e], pos_r[s:e])
            groups.append(_Group(prepared, np.ascontiguousarray(ids_src), np.ascontiguousarray(ids_dst), remote))
        x = _Xfer(self, op, groups, None, remote, notif, timeout if timeout is not None else self._cfg.timeout)
        return self._handle(x)

    def _pairs(self, loc: _Prepped, li: np.ndarray, rem: _Prepped, ri: np.ndarray) -> Tuple[Any, ...]:
        """The columns of one post of descriptor pairs (``Agent.post_columns``), computed in
        one vectorised pass: a request whose descriptors form no long runs."""
        ln, rn = loc.descs[li, 1], rem.descs[ri, 1]
        bad = np.flatnonzero(ln != rn)
        if len(bad):
            k = int(bad[0])
            raise nixlMismatchError(f"local descriptor {int(li[k])} is {int(ln[k])} bytes, remote descriptor {int(ri[k])} is {int(rn[k])}")
        return (loc.mems, loc.which[li], loc.offsets[li], rem.mems, rem.which[ri], rem.offsets[ri], np.ascontiguousarray(ln))

    def _prepare(self, src: _Run, dst: _Run) -> Any:
        """The prepared block transfer of two runs (cached), or None for two runs of one
        region at different places, which the engine's block transfers refuse."""
        key = (src.key, dst.key)
        p = self._blocks.get(key)
        if p is None:
            try:
                p = self._agent.prepare_blocks(src.layout, dst.layout)
            except gdpath.GdpathError as e:
                if getattr(e, "reason", None) == "shared_region_layouts":
                    return None
                raise from_gdpath(e, "prepare") from e
            with self._lock:
                self._blocks[key] = p
        return p

    def _handle(self, x: _Xfer) -> nixl_xfer_handle:
        with self._lock:
            h = nixl_xfer_handle(self._next, x)
            self._next += 1
            self._xfers[int(h)] = x
        return h

    def initialize_xfer(self, operation: str, local_descs: Any, remote_descs: Any, remote_agent: str, notif_msg: Any = b"", backends: Sequence[str] = (), *, timeout: Optional[float] = None) -> nixl_xfer_handle:
        """A transfer of ``local_descs[i]`` with ``remote_descs[i]`` of ``remote_agent``
        (both descriptor lists): prepares both and makes the transfer of all of them."""
        op = _op(operation)
        lh = self.prep_xfer_dlist(NIXL_INIT_AGENT, local_descs)
        rh = self.prep_xfer_dlist(remote_agent, remote_descs)
        try:
            n = self._prepped[int(lh)].n
            if self._prepped[int(rh)].n != n:
                raise nixlInvalidParamError(f"{n} local descriptors but {self._prepped[int(rh)].n} remote ones")
            idx = np.arange(n, dtype=np.int64)
            return self.make_prepped_xfer(op, lh, idx, rh, idx, notif_msg, timeout=timeout)
        finally:
            self.release_dlist_handle(lh)
            self.release_dlist_handle(rh)

    def _xfer(self, handle: int) -> _Xfer:
        x = self._xfers.get(int(handle)) if isinstance(handle, (int, np.integer)) else None
        if x is None:
            raise nixlNotFoundError(f"no transfer handle {handle!r} (released?)")
        return x

    def transfer(self, handle: int, notif_msg: Any = b"") -> str:
        """Posts the transfer: ``"DONE"`` when it completed within the call, else ``"PROC"``.
        ``notif_msg`` replaces the handle's message when not empty. Raises
        :class:`nixlRepostActiveError` while its last post is in flight, the NIXL class of
        the engine's refusal otherwise (its state is then ``"ERR"``)."""
        return self._xfer(handle).post(_message(notif_msg))

    def check_xfer_state(self, handle: int) -> str:
        """``"DONE"``, ``"PROC"`` (in flight) or ``"ERR"`` (failed, cancelled or past its
        deadline: ``handle.error`` says why). Raises :class:`nixlNotFoundError` for a released
        handle and :class:`nixlNotPostedError` for one never posted."""
        x = self._xfer(handle)
        if x.state == "INIT":
            raise nixlBind.nixlNotPostedError(f"transfer {int(handle)} was never posted")
        return x.state

    async def wait_xfer(self, handle: int) -> str:
        """Awaits the transfer (as ``await handle``): ``"DONE"``, or its NIXL exception."""
        return await self._xfer(handle).wait_async()

    def query_xfer_backend(self, handle: int) -> str:
        """``"UCX"`` for a transfer with a remote agent, ``"GDS"`` for a loopback one with files
        (the engine picks the path; the transfer reports of ``handle.transfers`` name it)."""
        x = self._xfer(handle)
        return "UCX" if x.remote is not None else ("GDS" if "FILE" in self.backends or "GDS" in self.backends else "UCX")

    def get_xfer_telemetry(self, handle: int) -> nixlBind.nixlXferTelemetry:
        """NIXL's telemetry of the transfer's last post (:class:`nixlXferTelemetry`: µs and
        bytes, measured here around the engine's post and completion). Raises
        :class:`nixlNoTelemetryError` unless the config has ``capture_telemetry=True`` (or
        ``$NIXL_TELEMETRY_ENABLE`` is ``y``/``1``, as NIXL reads it) or the handle was never
        posted, :class:`nixlNotFoundError` for a released handle."""
        x = self._xfer(handle)
        if not self._telemetry:
            raise nixlBind.nixlNoTelemetryError("telemetry is off (nixl_agent_config(capture_telemetry=True))")
        if x.state == "INIT":
            raise nixlBind.nixlNoTelemetryError(f"transfer {int(handle)} was never posted")
        return nixlBind.nixlXferTelemetry(x.start_us, x.post_us, x.xfer_us, x.nbytes, x.ndesc)

    def release_xfer_handle(self, handle: int) -> None:
        """Releases the handle; a transfer in flight is cancelled first (pairs not started
        are not moved). Later use raises :class:`nixlNotFoundError`."""
        with self._lock:
            x = self._xfers.pop(int(handle), None) if isinstance(handle, (int, np.integer)) else None
        if x is None:
            raise nixlNotFoundError(f"no transfer handle {handle!r} (released?)")
        if x.state == "PROC":
            x.cancel()

    # -- notifications ---------------------------------------------------------------------

    def _take(self) -> Dict[str, List[bytes]]:
        self._pump()
        with self._lock:
            got, self._inbox = self._inbox, []
        out: Dict[str, List[bytes]] = {}
        for n in got:
            out.setdefault(_sender_name(n.sender), []).append(bytes(n.message))
        return out

    def get_new_notifs(self, backends: Sequence[str] = ()) -> Dict[str, List[bytes]]:
        """Notifications that arrived since the last call: remote agent name → messages, in
        arrival order."""
        return self._take()

    def update_notifs(self, backends: Sequence[str] = ()) -> Dict[str, List[bytes]]:
        """Adds new notifications to ``self.notifs`` and returns it (every unhandled one)."""
        for k, v in self._take().items():
            self.notifs.setdefault(k, []).extend(v)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name: str, lookup_tag: bytes, backends: Sequence[str] = (), tag_is_prefix: bool = True) -> bool:
        """Whether a notification from ``remote_agent_name`` starts with (or, with
        ``tag_is_prefix=False``, contains) ``lookup_tag``; the first such one is removed from
        ``self.notifs``."""
        self.update_notifs()
        tag = _message(lookup_tag, "lookup_tag")
        msgs = self.notifs.get(remote_agent_name, [])
        for i, m in enumerate(msgs):
            if (m.startswith(tag) if tag_is_prefix else tag in m):
                del msgs[i]
                return True
        return False

    async def next_notif(self) -> Tuple[str, bytes]:
        """Awaits the next notification (gdpath: no polling): (remote agent name, message).
        Side-channel messages are handled on the way, not returned."""
        while True:
            with self._lock:
                if self._inbox:
                    n = self._inbox.pop(0)
                    return _sender_name(n.sender), bytes(n.message)
            n = await self._agent.notification()
            if not self._handle_control(n.sender, n.message):
                return _sender_name(n.sender), bytes(n.message)

    def send_notif(self, remote_agent_name: str, notif_msg: Any, backend: Optional[str] = None) -> None:
        """Sends ``notif_msg`` (bytes or str, at most 64 KiB) to an added remote agent.
        Raises :class:`nixlNotFoundError` for an unknown agent,
        :class:`nixlRemoteDisconnectError` when it cannot be reached."""
        r = self._remote(remote_agent_name)
        try:
            r.peer.notify(_message(notif_msg), self._cfg.op_timeout)
        except gdpath.GdpathError as e:
            raise from_gdpath(e, f"send_notif to {remote_agent_name!r}") from e

    # -- gdpath extras ---------------------------------------------------------------------

    @property
    def gdpath_agent(self) -> Any:
        """The :class:`gdpath.Agent` underneath (its regions, plans and transfers)."""
        return self._agent

    @property
    def address(self) -> str:
        """The address of this agent's channel (``host:port``)."""
        return self._server.address

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=self._cfg.num_threads or 4, thread_name_prefix=f"nixl-{self.name}"
                    )
        return self._executor

    def close(self) -> None:
        """Cancels transfers in flight, disconnects every remote agent and stops serving (in a
        cluster, withdrawing its record first)."""
        self._closed.set()
        if self._cluster:
            try:
                self._agent.cluster_leave()
            except gdpath.GdpathError:
                pass  # the record then goes when its lease expires
        for x in list(self._xfers.values()):
            if x.state == "PROC":
                x.cancel()
        for r in list(self._remotes.values()):
            try:
                r.peer.close(1.0)
            except gdpath.GdpathError:
                pass
        self._remotes.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        try:
            self._server.close(1.0)
        except gdpath.GdpathError:
            pass


def _op(operation: str) -> str:
    if operation not in ("READ", "WRITE"):
        raise nixlInvalidParamError(f"invalid op {operation!r} (READ or WRITE)")
    return operation


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "element_size")


def _sender_name(sender: str) -> str:
    """The agent name of a gdpath notification's sender (``name@address``)."""
    name = sender.rsplit("@", 1)[0] if "@" in sender else sender
    return _cluster_base_name(name)


def _cluster_base_name(name: str) -> str:
    """``NAME`` of a cluster member's engine name ``NAME#INCARNATION`` (32 hex digits,
    docs/cluster.md), else ``name`` unchanged."""
    base, sep, inc = name.rpartition("#")
    if sep and len(inc) == 32 and all(c in "0123456789abcdef" for c in inc):
        return base
    return name


def etcd_url_from_env(environ: Optional[Dict[str, str]] = None) -> Optional[str]:
    """gdpath's cluster URL for NIXL's etcd settings, or None without ``NIXL_ETCD_ENDPOINTS``.

    ``NIXL_ETCD_ENDPOINTS``: comma-separated ``http://host:port`` (``https://`` for TLS; all
    alike); ``NIXL_ETCD_NAMESPACE`` (NIXL's default ``/nixl/agents/``): its path without a
    trailing ``agents`` component, joined by ``.``, is gdpath's namespace (``nixl``), so
    records lie under ``/nixl/agents/NAME``. Raises :class:`nixlInvalidParamError` for
    endpoints or a namespace gdpath cannot use."""
    env = os.environ if environ is None else environ
    endpoints = env.get("NIXL_ETCD_ENDPOINTS", "").strip()
    if not endpoints:
        return None
    schemes, hosts = set(), []
    for ep in endpoints.split(","):
        ep = ep.strip()
        scheme, sep, rest = ep.partition("://")
        if not sep:
            scheme, rest = "http", ep
        if scheme not in ("http", "https") or not rest or "/" in rest.rstrip("/"):
            raise nixlInvalidParamError(f"NIXL_ETCD_ENDPOINTS: {ep!r} is not http(s)://host:port")
        schemes.add(scheme)
        hosts.append(rest.rstrip("/"))
    if len(schemes) != 1:
        raise nixlInvalidParamError("NIXL_ETCD_ENDPOINTS: mixes http:// and https:// endpoints")
    parts = [p for p in env.get("NIXL_ETCD_NAMESPACE", "/nixl/agents/").split("/") if p]
    if parts and parts[-1] == "agents":
        parts = parts[:-1]
    ns = ".".join(parts)
    if not ns:
        raise nixlInvalidParamError(f"NIXL_ETCD_NAMESPACE {env.get('NIXL_ETCD_NAMESPACE')!r} names no namespace")
    return f"{'etcds' if 'https' in schemes else 'etcd'}://{','.join(hosts)}/{ns}"


def _parse_blob(metadata: Any) -> Tuple[str, str, List[Tuple[str, int, int, int, int]]]:
    """Name, address and regions of a metadata blob: untrusted, bounded, every field checked."""
    if not isinstance(metadata, (bytes, bytearray, memoryview)):
        raise nixlInvalidParamError(f"metadata must be bytes, not {type(metadata).__name__}")
    blob = bytes(metadata)
    if len(blob) > _MAX_BLOB:
        raise nixlInvalidParamError(f"metadata of {len(blob)} bytes is larger than the {_MAX_BLOB} accepted")
    if not blob.startswith(_MAGIC):
        raise nixlInvalidParamError("not gdpath.nixl metadata (NIXL's own blobs cannot be read by gdpath)")
    try:
        body = json.loads(blob[len(_MAGIC):].decode("utf-8"))
        name, address, regions = body["name"], body["address"], body["regions"]
        if not (isinstance(name, str) and 0 < len(name) <= 256 and isinstance(address, str) and len(address) <= 300):
            raise ValueError("name or address")
        if not isinstance(regions, list) or len(regions) > _MAX_REGIONS:
            raise ValueError("regions")
        out = []
        for r in regions:
            mt, dv, base, n, eid = r
            if mt not in ("DRAM", "VRAM", "FILE") or not all(type(v) is int and 0 <= v < 1 << 64 for v in (dv, base, n, eid)) or base + n >= 1 << 64:
                raise ValueError(f"region {r!r}"[:200])
            out.append((mt, dv, base, n, eid))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
        # RecursionError: JSON nested deeper than the interpreter's stack (a hostile blob).
        raise nixlInvalidParamError(f"malformed gdpath.nixl metadata: {type(e).__name__}: {str(e)[:200]}") from None
    return name, address, out
