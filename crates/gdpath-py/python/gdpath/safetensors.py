"""Safetensors checkpoints through gdpath's loader and saver: a drop-in for
``safetensors.torch.load_file`` / ``save_file``, ``safetensors.numpy.load_file`` / ``save_file``,
and ``safe_open``.

:func:`load_file` validates every header first (nothing is allocated for a malformed file),
makes **one allocation** for the whole checkpoint — on the GPU for ``device="cuda:N"``, in
host memory for ``device="cpu"`` — and reads it with one engine transfer on the fastest path
the machine has (GDS, O_DIRECT through pinned bounce buffers, buffered), one read per file.
Each tensor is a view of that allocation (made through DLPack, no copy) that holds it: the
allocation is freed when the last of its tensors is freed. Dtypes, shapes and names are those
of the file (bf16 and fp8 included); a sharded checkpoint (several files, or its
``model.safetensors.index.json``) is one plan and one allocation.

:func:`save_file` writes PyTorch tensors, CuPy arrays and NumPy arrays (GPU or host memory, any
mix) through the engine's save: the header as the ``safetensors`` package writes it, the data
moved straight from where the tensors are (GDS where cuFile works, pinned staging with parallel
writers otherwise), into a temporary file that is fsynced and renamed over the target, so a
crash or kill leaves the old file or the new one, never a torn one.

PyTorch is needed only for ``framework="pt"`` (the default of ``load_file``), NumPy only for
``framework="numpy"``; installing gdpath needs neither.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Set as AbstractSet
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _native, default_agent

__all__ = ["load_file", "safe_open", "save_file"]

PathLike = Union[str, bytes, "os.PathLike[str]"]
Files = Union[PathLike, Sequence[PathLike]]


def _gpu_of(device: Any) -> Optional[int]:
    """The CUDA ordinal ``device`` names (``"cuda:1"``, ``1``, ``torch.device``), or ``None``
    for ``"cpu"``."""
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"device {device}: a CUDA ordinal is not negative")
        return device
    text = str(device)
    if text == "cpu":
        return None
    if text == "cuda":
        try:
            import torch

            return int(torch.cuda.current_device())
        except Exception:
            return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise ValueError(f"device {device!r}: \"cpu\", \"cuda\", \"cuda:N\" or a CUDA ordinal")


def _load_args(
    framework: str, device: Any, agent: Optional["_native.Agent"], direct: Optional[bool]
) -> Tuple["_Builder", Optional[int]]:
    """The tensor builder and CUDA ordinal of ``load_file``'s and ``safe_open``'s arguments,
    checked before any file is opened: ``ValueError`` for ``direct`` with ``agent`` (the native
    load refuses the pair too, for callers of ``_native`` itself) and for a GPU with NumPy."""
    if agent is not None and direct is not None:
        raise ValueError("direct= chooses the settings of the module's own agents: an agent "
                         "given loads with its own configuration (leave direct=None)")
    build = _Builder(framework)
    gpu = _gpu_of(device)
    if build.framework == "np" and gpu is not None:
        raise ValueError("framework=\"numpy\" loads into host memory: device must be \"cpu\"")
    return build, gpu


def _open(files: Files) -> "_native.Checkpoint":
    """A checkpoint of one file, of several (a list), or of the shards an index (a ``.json``
    path) lists, as the engine's ``Checkpoint::open_paths`` and ``gdpath load`` name them."""
    if isinstance(files, (str, bytes, os.PathLike)):
        return _native.Checkpoint.open_paths([os.fsdecode(files)])
    if isinstance(files, (Mapping, AbstractSet)):
        # Iterating would take a dict's keys, or a set's paths in no fixed order, as shards.
        raise TypeError(
            f"{type(files).__name__}: a checkpoint's shards are a list of paths, in order"
        )
    try:
        paths = [os.fsdecode(f) for f in files]
    except TypeError as e:
        raise TypeError(
            f"{type(files).__name__}: a checkpoint is a path (str, bytes, os.PathLike), a list "
            "of its shards' paths, or its model.safetensors.index.json"
        ) from e
    return _native.Checkpoint.open_paths(paths)


def _framework(framework: str) -> str:
    if framework in ("pt", "torch", "pytorch"):
        return "pt"
    if framework in ("np", "numpy"):
        return "np"
    raise ValueError(f"framework {framework!r}: \"pt\" (PyTorch) or \"numpy\"")


def _torch_dtypes() -> Dict[str, Any]:
    import torch

    names = {
        "F64": "float64",
        "F32": "float32",
        "F16": "float16",
        "BF16": "bfloat16",
        "I64": "int64",
        "I32": "int32",
        "I16": "int16",
        "I8": "int8",
        "U8": "uint8",
        "U16": "uint16",
        "U32": "uint32",
        "U64": "uint64",
        "BOOL": "bool",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
    }
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


def _numpy_dtypes() -> Dict[str, Any]:
    import numpy as np

    return {
        "F64": np.float64,
        "F32": np.float32,
        "F16": np.float16,
        "I64": np.int64,
        "I32": np.int32,
        "I16": np.int16,
        "I8": np.int8,
        "U8": np.uint8,
        "U16": np.uint16,
        "U32": np.uint32,
        "U64": np.uint64,
        "BOOL": np.bool_,
    }


class _Builder:
    """Makes framework tensors from a loaded checkpoint's DLPack views."""

    def __init__(self, framework: str):
        self.framework = _framework(framework)
        if self.framework == "pt":
            try:
                import torch
            except ImportError as e:
                raise ImportError(
                    'framework="pt" (the default, as safetensors.torch) needs PyTorch, which '
                    'does not import here; framework="numpy" loads into host memory without it'
                ) from e

            self._from = torch.from_dlpack
            self._dtypes = _torch_dtypes()
        else:
            import numpy as np

            self._from = np.from_dlpack
            self._dtypes = _numpy_dtypes()

    def tensor(self, loaded: "_native.LoadedCheckpoint", i: int, info: "_native.TensorInfo") -> Any:
        dtype = self._dtypes.get(info.dtype)
        if dtype is None:
            lib = "PyTorch" if self.framework == "pt" else "NumPy"
            raise TypeError(f"tensor {info.name!r}: {lib} has no dtype for safetensors' {info.dtype}")
        raw = self._from(loaded.view(i))  # 1-D uint8, the tensor's bytes in place
        return raw.view(dtype).reshape(tuple(info.shape))


def load_file(
    filename: Files,
    device: Any = "cpu",
    *,
    framework: str = "pt",
    agent: Optional["_native.Agent"] = None,
    direct: Optional[bool] = None,
) -> Dict[str, Any]:
    """Loads a safetensors checkpoint: ``{name: tensor}`` in file order, as
    ``safetensors.torch.load_file`` (``framework="pt"``, the default) or
    ``safetensors.numpy.load_file`` (``framework="numpy"``, ``device="cpu"`` only) return it.

    ``filename``: a ``.safetensors`` file, a list of them (a sharded checkpoint), or a
    ``model.safetensors.index.json``. ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or an
    ordinal. ``agent``: the :class:`gdpath.Agent` to load with; by default the storage
    settings the engine's chooser picks for these files (threads, bytes per request, O_DIRECT
    or the page cache, cuFile), as ``gdpath load`` uses them, through an agent the module keeps
    for those settings: a cold file on ext4, xfs or btrfs is read with O_DIRECT, which leaves
    no copy in the page cache. ``direct``: ``False`` reads through the page cache (it then keeps the
    file for the next reader, such as other processes loading the same checkpoint), ``True``
    with O_DIRECT where the file system allows, ``None`` (default) as the chooser decides; as
    ``gdpath load --buffered`` / ``--direct``, and only without ``agent``. The GIL is released
    while the bytes move.

    Raises ``ValueError`` for ``direct`` with ``agent``; :class:`gdpath.CheckpointError` (kind
    ``checkpoint``) for a malformed file or index before anything is allocated;
    :class:`gdpath.StorageError` (kinds ``open``, ``io``), which is also ``FileNotFoundError``
    for a missing file as with ``safetensors``, when a file cannot be opened or read;
    :class:`gdpath.GdpathError` with the engine's kind for the rest (``unsupported`` for a GPU
    without a CUDA driver); ``TypeError`` for a dtype the framework lacks (NumPy has no bf16
    or fp8, as with ``safetensors.numpy``).
    """
    build, gpu = _load_args(framework, device, agent, direct)
    ck = _open(filename)
    loaded = ck.load(agent, gpu=gpu, direct=direct)
    return {t.name: build.tensor(loaded, i, t) for i, t in enumerate(loaded.tensors)}


class safe_open:
    """``safe_open(filename, framework="pt", device="cpu")``, as ``safetensors.safe_open``:
    ``keys()`` (sorted), ``metadata()`` (the ``__metadata__`` dict, or ``None``),
    ``get_tensor(name)``, ``get_tensors()``, iteration over the keys, and use as a context
    manager. ``filename`` may also be a list of files or an index (a sharded checkpoint).

    Opening reads and validates the headers only. ``get_tensor(name)`` loads that tensor
    alone (one allocation of its own); ``get_tensors()`` and :meth:`tensors` load every tensor
    with one transfer into one allocation, as :func:`load_file`. ``agent`` and ``direct`` as
    for :func:`load_file` (``ValueError`` for both).
    """

    def __init__(
        self,
        filename: Files,
        framework: str = "pt",
        device: Any = "cpu",
        *,
        agent: Optional["_native.Agent"] = None,
        direct: Optional[bool] = None,
    ):
        self._build, self._gpu = _load_args(framework, device, agent, direct)
        self._agent = agent
        self._direct = direct
        self._ck = _open(filename)
        self._infos = {t.name: t for t in self._ck.tensors()}

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def keys(self) -> List[str]:
        """Tensor names, sorted."""
        return sorted(self._infos)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._infos)

    def __contains__(self, name: object) -> bool:
        return name in self._infos

    def metadata(self) -> Optional[Dict[str, str]]:
        """The files' ``__metadata__`` (merged, first file first), or ``None`` if none has one."""
        merged: Dict[str, str] = {}
        for i in range(len(self._ck.files)):
            for k, v in self._ck.metadata(i).items():
                merged.setdefault(k, v)
        return merged or None

    def info(self, name: str) -> "_native.TensorInfo":
        """Dtype, shape, byte count and file of tensor ``name``."""
        return self._infos[name]

    def get_tensor(self, name: str) -> Any:
        """Tensor ``name``, loaded now into an allocation of its own. Raises
        :class:`gdpath.CheckpointError` for a name the checkpoint does not hold."""
        loaded = self._ck.load(self._agent, gpu=self._gpu, names=[name], direct=self._direct)
        return self._build.tensor(loaded, 0, loaded.tensors[0])

    def tensors(self) -> Iterator[Tuple[str, Any]]:
        """``(name, tensor)`` for every tensor in file order, all loaded with one transfer into
        one allocation."""
        loaded = self._ck.load(self._agent, gpu=self._gpu, direct=self._direct)
        for i, t in enumerate(loaded.tensors):
            yield t.name, self._build.tensor(loaded, i, t)

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, as :func:`load_file` returns them."""
        return dict(self.tensors())


def _dtype_name(obj: Any) -> str:
    """The safetensors dtype name of a PyTorch tensor's or a NumPy / CuPy array's dtype."""
    dt = getattr(obj, "dtype", None)
    if dt is None or not hasattr(obj, "shape"):
        raise TypeError(
            f"{type(obj).__name__}: save_file takes PyTorch tensors, CuPy arrays and NumPy arrays"
        )
    if type(obj).__module__.startswith("torch"):
        for name, t in _torch_dtypes().items():
            if dt == t:
                return name
    else:
        import numpy as np

        for name, t in _numpy_dtypes().items():
            if np.dtype(dt) == np.dtype(t):
                return name
    raise TypeError(f"dtype {dt} has no safetensors name")


def _little_endian(obj: Any) -> Any:
    """A NumPy scalar as a 0-d array, and a NumPy array of big-endian items as a little-endian
    copy (the format stores little-endian, as ``safetensors.numpy`` converts it); anything
    else as it is."""
    if not type(obj).__module__.startswith("numpy"):
        return obj
    import numpy as np

    if isinstance(obj, np.generic):
        obj = np.asarray(obj)
    if isinstance(obj, np.ndarray) and obj.dtype.byteorder == ">":
        obj = obj.astype(obj.dtype.newbyteorder("<"))
    return obj


def _raw(obj: Any) -> Any:
    """``obj``'s bytes as a contiguous 1-D ``uint8`` tensor or array of the same library and
    device (a copy only when ``obj`` is not contiguous)."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
        import torch

        t = obj.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        return t.reshape(-1).view(torch.uint8)
    if mod.startswith("cupy"):
        import cupy

        return cupy.ascontiguousarray(obj).reshape(-1).view(cupy.uint8)
    import numpy as np

    if not isinstance(obj, np.ndarray):
        raise TypeError(
            f"{type(obj).__name__}: save_file takes PyTorch tensors, CuPy arrays and NumPy arrays"
        )
    return np.ascontiguousarray(obj).reshape(-1).view(np.uint8)


def save_file(
    tensors: Dict[str, Any],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    *,
    fsync: bool = True,
    overwrite: bool = True,
    agent: Optional["_native.Agent"] = None,
) -> Dict[str, Any]:
    """Saves ``{name: tensor}`` as the safetensors file ``filename``, as
    ``safetensors.torch.save_file(tensors, filename, metadata)`` does (the same header and data
    order, so either package reads it back the same), from wherever the tensors are: PyTorch
    tensors, CuPy arrays and NumPy arrays, on any GPU or in host memory, mixed. Every dtype of
    the format (bf16 and fp8 included) and zero-size tensors; a tensor that is not contiguous
    is saved as its values, copied contiguous first (as ``safetensors.torch`` does;
    ``safetensors.numpy.save_file`` 0.8.0 writes such an array's underlying buffer instead),
    and tensors sharing memory are each saved whole. NumPy scalars are saved as 0-d tensors and
    big-endian arrays as little-endian copies (the format's byte order).

    ``metadata``: the header's ``__metadata__`` (str → str). ``fsync``: sync the file before it
    takes its name and the directory after (default); ``False`` for scratch data (a killed
    process still leaves no torn file; a power loss may). ``overwrite``: replace an existing
    file (default, as ``safetensors``); ``False`` raises kind ``exists``. A replaced file keeps
    its owner (where the writer may set it: root does), group, permission bits and extended
    attributes; set-user-ID and set-group-ID bits are dropped. A symbolic link ``filename`` is
    followed, as ``open()`` follows it, unless the kernel's ``protected_symlinks`` rule forbids
    it whatever the sysctl says: a link in a sticky world-writable directory (``/tmp``) owned
    by neither this user nor the directory's owner raises kind ``symlink_refused`` (a
    ``PermissionError``) and nothing is written. ``agent``: the
    :class:`gdpath.Agent` to save with (default :func:`gdpath.default_agent`). The GIL is
    released while the bytes move.

    Returns the save's report: ``path`` (the file written: when ``filename`` is a symbolic
    link, the real file it leads to), ``tensors``, ``tensor_bytes``, ``header_bytes``,
    ``file_bytes`` (bytes), ``paths`` (the engine paths that moved the data: ``gds-native``,
    ``posix-direct``, ...), ``finding`` (why the preferred path was not taken, or ``None``),
    ``fsync``, ``replaced``, ``elapsed``, ``transfer``, ``commit`` (seconds; ``elapsed`` covers
    the whole save, fsync included) and ``gbps`` (file bytes per second of ``elapsed``, GB/s
    = 1e9 B/s).

    Raises ``TypeError`` for an object or dtype it cannot save, ``ValueError`` for metadata
    that is not str → str; :class:`gdpath.CheckpointError` (kind ``checkpoint``) for a
    reserved name (``__metadata__``); :class:`gdpath.GdpathError` with the engine's kind for
    the file (``exists``, ``symlink_refused``, ``no_space`` — checked before any data is
    written — ``io``) and the
    transfer. On any error the file is as it was and no temporary is left.
    """
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("metadata: keys and values must be str")
        metadata = dict(metadata)
    agent = agent or default_agent()
    keep: List[Any] = []  # the arrays and regions stay alive until the save returns
    empty = None
    entries = []
    for name, obj in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor name {name!r}: names are str")
        obj = _little_endian(obj)
        dtype = _dtype_name(obj)
        shape = [int(d) for d in obj.shape]
        raw = _raw(obj)
        nbytes = int(raw.nbytes)
        if nbytes == 0:
            # Nothing to move: any region will do, and an empty one cannot be registered.
            if empty is None:
                empty = agent.register(bytearray(1))
            region = empty
        else:
            region = agent.register(raw)
        keep.append((raw, region))
        entries.append((name, dtype, shape, region, 0, nbytes))
    report = _native.Checkpoint.save(
        agent, entries, os.fsdecode(filename), metadata=metadata, overwrite=overwrite, fsync=fsync
    )
    del keep
    return report
