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

The rest of the ``safetensors`` 0.8 API is here too, so that a program written for it runs
unchanged: :class:`SafetensorError` (the package's own class where ``safetensors`` is
installed), :class:`TensorSpec`, :func:`serialize`, :func:`serialize_file`,
:func:`deserialize`, ``safe_open(...).get_slice`` / ``offset_keys``; ``gdpath.safetensors.torch``
and ``gdpath.safetensors.numpy`` mirror ``safetensors.torch`` and ``safetensors.numpy``, and
:func:`install` routes programs that import ``safetensors`` through gdpath (docs/python.md lists
every difference).
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from collections.abc import Mapping, Set as AbstractSet
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from .. import _native, default_agent
from ..errors import CheckpointError, StorageError, _from_native

__all__ = [
    "SafetensorError", "TensorSpec", "deserialize", "install", "load_file", "safe_open",
    "save_file", "serialize", "serialize_file", "uninstall",
]

__version__ = "0.8.0"
"""The ``safetensors`` release whose API this module follows."""

try:
    # The package's own class, so that `except safetensors.SafetensorError` catches ours.
    from safetensors import SafetensorError as _Base  # type: ignore[import-not-found]

    if getattr(_Base, "__module__", "").startswith("gdpath"):
        raise ImportError("safetensors is gdpath's own (installed)")
except ImportError:

    class _Base(Exception):  # type: ignore[no-redef]
        """``safetensors.SafetensorError`` where that package is not installed."""


SafetensorError = _Base
"""What ``safetensors`` raises for a malformed file, an unknown tensor name, a bad slice or a
closed handle: ``safetensors.SafetensorError`` itself where the package imports, else a class
of this module."""


class _CheckpointSafetensorError(CheckpointError, _Base):  # type: ignore[misc, valid-type]
    """A :class:`gdpath.CheckpointError` (kind ``checkpoint``) that is also a
    :data:`SafetensorError`, so code written for either package catches it."""


class _NoDtypeError(TypeError, KeyError, AttributeError):
    """A tensor whose dtype the framework lacks (NumPy: bf16, fp8, F4). A ``TypeError``, and
    also what ``safetensors.numpy`` happens to raise for one: ``KeyError`` from ``load(bytes)``,
    ``AttributeError`` (F4, F8_E8M0, the FNUZ fp8s) from ``load_file`` and ``safe_open``, so a
    program's ``except`` catches it either way."""

    __str__ = BaseException.__str__


# The engine's reasons for which safetensors has fixed words of its own, and those words.
_ST_WORDS = (
    ("is too short for a safetensors header", "header too small"),
    ("-byte limit: not a safetensors file", "header too large"),
    ("bytes reaches past the end of the", "invalid header length"),
    ("reach past the end of the file", "incomplete metadata, file not fully covered"),
)


def _worded(message: str) -> str:
    """``message`` (the engine's) behind safetensors' own words for the same fault, where it
    has fixed ones, so that a program matching on them still matches."""
    for fragment, words in _ST_WORDS:
        if fragment in message:
            return f"{words}: {message}"
    return message


def _st_error(e: CheckpointError, prefix: str = "") -> "_CheckpointSafetensorError":
    return _CheckpointSafetensorError(prefix + _worded(e.message), e.kind, e.finding)

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
    path) lists, as the engine's ``Checkpoint::open_paths`` and ``gdpath load`` name them; a
    malformed one raises a :class:`gdpath.CheckpointError` that is also a
    :data:`SafetensorError`, a missing one a :class:`gdpath.StorageError` that is also
    ``FileNotFoundError``, worded as safetensors words it (``No such file or directory: PATH``)."""
    try:
        ck = _open_paths(files)
    except _CheckpointSafetensorError:
        raise
    except FileNotFoundError as e:
        if not isinstance(e, StorageError):
            raise
        # safetensors' own words for a missing file, so a program matching on them still does.
        raise _from_native(e.kind, f"No such file or directory: {e.filename}", e.finding,
                           {"errno": e.errno, "filename": e.filename}) from None
    except CheckpointError as e:
        # safetensors' prefix for a file's header, then its words where it has fixed ones.
        raise _st_error(e, "Error while deserializing header: ") from None
    _refuse_trailing(ck)
    return ck


# What safetensors says of a file or buffer with bytes after its data section.
_UNCOVERED = "incomplete metadata, file not fully covered"


def _data_end(ck: "_native.Checkpoint", file: int, header_len: int) -> int:
    """The byte just past file ``file``'s data section: past its last tensor, or past its
    header for a file without tensor bytes."""
    ends = [t.offset + t.nbytes for t in ck.tensors() if t.file == file]
    return max([8 + header_len] + ends)


def _refuse_trailing(ck: "_native.Checkpoint") -> None:
    """Raises :data:`SafetensorError` (safetensors' words, then the file) for a file with bytes
    after its data section: the format has none and safetensors refuses such a file; the engine
    would never read them, so accepting them would be silently lenient."""
    for i, name in enumerate(ck.files):
        path = os.fsdecode(name)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            header_len = int.from_bytes(os.pread(fd, 8, 0), "little")
        finally:
            os.close(fd)
        extra = size - _data_end(ck, i, header_len)
        if extra:
            raise _CheckpointSafetensorError(
                f"Error while deserializing header: {_UNCOVERED}: {path} has {extra} bytes "
                "after its data section", "checkpoint")


def _open_paths(files: Files) -> "_native.Checkpoint":
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
    raise ValueError(f"framework {framework!r}: \"pt\" (PyTorch) or \"numpy\" (gdpath has no "
                     "TensorFlow, Flax, MLX or Paddle loader)")


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
        "F8_E8M0": "float8_e8m0fnu",
        "F8_E4M3FNUZ": "float8_e4m3fnuz",
        "F8_E5M2FNUZ": "float8_e5m2fnuz",
        "F4": "float4_e2m1fn_x2",
        "C64": "complex64",
    }
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


def _same_size_bits(t: Any) -> Any:
    """A view of PyTorch tensor ``t`` as the unsigned/signed integer dtype of its element size
    (``uint8`` for bool, fp8, ``float4_e2m1fn_x2``; ``int16``/``int32``/``int64`` for the wider
    ones), so copies and device moves run the integer kernels: PyTorch has no copy kernel for
    some sub-byte and fp8 dtypes (``copy_kernel`` is not implemented for ``Float4_e2m1fn_x2``),
    while a view between dtypes of one element size keeps any strides and moves no byte.
    ``t`` itself when its element size has no integer dtype."""
    import torch

    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
    return t if bits is None or t.dtype == bits else t.view(bits)


def _torch_contiguous(t: Any) -> Any:
    """``t.contiguous()`` for every dtype of the format: the copy (if any) moves the bytes as
    integers of the same size (see :func:`_same_size_bits`), then views them as ``t``'s dtype."""
    if t.is_contiguous():
        return t
    return _same_size_bits(t).contiguous().view(t.dtype)


def _torch_to(t: Any, device: Any) -> Any:
    """``t.to(device)`` for every dtype of the format, the bytes moved as integers of the same
    size (see :func:`_same_size_bits`)."""
    return _same_size_bits(t).to(device).view(t.dtype)


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
        "C64": np.complex64,
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
        return self.shaped(self._from(loaded.view(i)), info)  # the tensor's bytes in place

    def dtype(self, info: "_native.TensorInfo") -> Any:
        dtype = self._dtypes.get(info.dtype)
        if dtype is None:
            lib = "PyTorch" if self.framework == "pt" else "NumPy"
            raise _NoDtypeError(f"tensor {info.name!r}: {lib} has no dtype for safetensors' "
                                f"{info.dtype}")
        return dtype

    def shaped(self, raw: Any, info: "_native.TensorInfo") -> Any:
        """``raw`` (1-D ``uint8`` bytes of ``info``'s tensor) as that tensor; a tensor without
        bytes (a zero in its shape) is a new empty one of its shape and dtype on ``raw``'s
        device."""
        dtype, shape = self.dtype(info), _storage_shape(info.dtype, info.shape)
        if self.framework == "pt" and raw.numel() == 0:
            import torch

            # PyTorch refuses to view an empty byte tensor (stride 0) as a wider dtype.
            return torch.empty(shape, dtype=dtype, device=raw.device)
        return raw.view(dtype).reshape(shape)

    def host_bytes(self, n: int) -> Any:
        """An empty 1-D ``uint8`` host array of ``n`` bytes to read into."""
        import numpy as np

        return np.empty(n, dtype=np.uint8)

    def wrap(self, arr: Any) -> Any:
        """A host NumPy ``uint8`` array as this framework's tensor (no copy)."""
        if self.framework == "pt":
            import torch

            return torch.from_numpy(arr)
        return arr


def _storage_shape(dtype: str, shape: Sequence[int]) -> Tuple[int, ...]:
    """The framework's shape of a tensor the header gives as ``shape``: PyTorch packs two F4
    values in one ``float4_e2m1fn_x2`` element, so its last dimension is half the header's (the
    header counts values, as ``safetensors`` writes it)."""
    if dtype == "F4" and shape:
        return tuple(shape[:-1]) + (shape[-1] // 2,)
    return tuple(shape)


def load_file(
    filename: Files,
    device: Any = "cpu",
    *,
    framework: str = "pt",
    backend: str = "mmap",
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
    if backend not in ("mmap", "pread"):
        raise ValueError(f"backend {backend!r}: \"mmap\" or \"pread\"")
    build, gpu = _load_args(framework, device, agent, direct)
    ck = _open(filename)
    loaded = ck.load(agent, gpu=gpu, direct=direct)
    return {t.name: build.tensor(loaded, i, t) for i, t in enumerate(loaded.tensors)}


def _read_at(fd: int, buf: Any, offset: int, path: str) -> None:
    """Fills ``buf`` (a writable byte buffer) from ``fd`` at ``offset`` with ``pread``; a short
    read (a file cut since its header was checked) raises :data:`SafetensorError`, never a
    torn tensor."""
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise SafetensorError(f"{path}: the file ended at byte {offset + done}, before the "
                                  "tensor's end (cut since its header was read)")
        done += n


def _indexers(index: Any, shape: Sequence[int]) -> List[Tuple[int, int, int, bool]]:
    """``index`` (an int, a slice with a positive step, ``...``, a tuple of those, or ``[]``)
    as ``(start, stop, step, selected)`` per leading dimension, under ``safetensors``' rules and
    messages: no clamping (a bound past a dimension is an error), negative ints count from the
    end, negative slice bounds and steps are refused."""
    if isinstance(index, list):
        if index:
            raise SafetensorError("Non empty lists are not implemented")
        # safetensors reads `[]` as the slice 0:0 of the first dimension (a 0-d tensor has none).
        index = slice(0, 0)
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(1 for it in items if it is Ellipsis) > 1:
        raise SafetensorError("Only one ellipsis (...) is allowed in slice index")
    expand = max(len(shape) - (len(items) - items.count(Ellipsis)), 0)
    out: List[Tuple[Optional[int], Optional[int], int, bool]] = []
    for it in items:
        dim = len(out)
        if it is Ellipsis:
            out.extend([(None, None, 1, False)] * expand)
        elif isinstance(it, slice):
            for b in (it.start, it.stop):
                if b is not None and (not isinstance(b, int) or b < 0):
                    # safetensors converts bounds to unsigned ints (PyO3's words).
                    raise OverflowError("can't convert negative int to unsigned")
            step = 1 if it.step is None else it.step
            if not isinstance(step, int) or step <= 0:
                raise SafetensorError(f"Slice step must be a positive integer, got {step}")
            out.append((it.start, it.stop, step, False))
        elif isinstance(it, int):
            it = int(it)  # a bool is the int 0 or 1 to safetensors, as to Python
            size = shape[dim] if dim < len(shape) else 0
            if it < 0:
                if it + size < 0:
                    raise SafetensorError(f"Invalid index {it} for dimension {dim} of size {size}")
                it += size
            out.append((it, it + 1, 1, True))
        else:
            raise SafetensorError(f"Unsupported slice index at position {dim}: expected slice, "
                                  "int, or ellipsis")
    shown = ", ".join(
        str(a) if sel else f"{'' if a is None else a}:{'' if b is None else b}"
        + ("" if st == 1 else f":{st}")
        for a, b, st, sel in out
    )
    if len(out) > len(shape):
        raise SafetensorError(f"Error during slicing [{shown}] with shape {list(shape)}: more "
                              "slicing indexes than dimensions in tensor")
    done = []
    # safetensors checks the last dimension first: with several bounds out of range, its
    # message names the innermost one.
    for d in reversed(range(len(out))):
        a, b, st, sel = out[d]
        size = shape[d]
        start = 0 if a is None else a
        stop = size if b is None else b
        if start >= size or stop > size:
            asked = start if start >= size else max(stop - 1, 0)
            raise SafetensorError(f"Error during slicing [{shown}] with shape {list(shape)}: index "
                                  f"{asked} out of bounds for tensor dimension #{d} of size {size}")
        done.append((start, max(stop, start), st, sel))
    return done[::-1]


class _Slice:
    """What :meth:`safe_open.get_slice` returns, as ``safetensors``' slice object:
    ``get_shape()``, ``get_dtype()`` and ``[index]``, which reads the tensor's bytes for the rows
    of its first dimension the index covers (nothing else) and returns a new contiguous tensor.
    Index rules and error messages are ``safetensors``': PyTorch's indexing for
    ``framework="pt"`` (F4 aside), its own rules for NumPy and F4 (see :func:`_indexers`)."""

    def __init__(self, owner: "safe_open", info: "_native.TensorInfo"):
        self._owner, self._info = owner, info

    def get_shape(self) -> List[int]:
        """The header's shape (elements; F4 counts values, not packed pairs)."""
        return list(self._info.shape)

    def get_dtype(self) -> str:
        """The header's dtype name (``"F32"``, ``"BF16"``, ...)."""
        return self._info.dtype

    def __getitem__(self, index: Any) -> Any:
        return self._owner._slice(self._info, index)


class safe_open:
    """``safe_open(filename, framework, device="cpu", *, backend="mmap")``, as
    ``safetensors.safe_open``: ``keys()`` (sorted), ``offset_keys()`` (file order),
    ``metadata()`` (the ``__metadata__`` dict, or ``None``), ``get_tensor(name)``,
    ``get_slice(name)`` (a :class:`_Slice`), ``get_tensors()``, iteration over the keys, and use
    as a context manager (leaving it closes the handle: any later call raises
    :data:`SafetensorError`). ``filename`` may also be a list of files or an index (a sharded
    checkpoint). ``backend`` (``"mmap"`` or ``"pread"``) is accepted for compatibility: gdpath
    reads with ``pread`` or its engine either way (a file cut under a mapping would kill the
    process with ``SIGBUS``).

    Opening reads and validates the headers only. Host tensors (``device="cpu"``) are read
    with one ``pread`` each, straight into the new tensor. On a CUDA device (PyTorch), the first
    ``get_tensor`` or ``get_tensors`` loads **every tensor of the checkpoint with one engine
    transfer into one GPU allocation** (as :func:`load_file`) and each ``get_tensor`` then
    returns a view of it: the pattern of transformers and vLLM (every key in turn) moves the
    bytes once, at the engine's rate. The allocation holds the checkpoint's tensor bytes until
    the handle is closed and the last tensor taken from it is freed. ``prefetch=False`` (or a
    checkpoint larger than 90 % of the GPU's free memory, per ``torch.cuda.mem_get_info``) loads
    each tensor alone instead. A slice reads only its rows (on the host, then copied to the
    device) unless the whole checkpoint is already on the GPU. ``agent`` and ``direct`` as for
    :func:`load_file` (``ValueError`` for both).

    Raises ``FileNotFoundError`` (a :class:`gdpath.StorageError`) for a missing file, a
    :data:`SafetensorError` that is also :class:`gdpath.CheckpointError` for a malformed one or
    an unknown name, :data:`SafetensorError` for a bad slice index (``safetensors``' messages).
    """

    def __init__(
        self,
        filename: Files,
        framework: str = "pt",
        device: Any = "cpu",
        *,
        backend: str = "mmap",
        agent: Optional["_native.Agent"] = None,
        direct: Optional[bool] = None,
        prefetch: bool = True,
    ):
        if backend not in ("mmap", "pread"):
            raise ValueError(f"backend {backend!r}: \"mmap\" or \"pread\"")
        self._build = _Builder(framework)
        self._device = device
        self._gpu = None if self._build.framework == "np" else _gpu_of_or_none(device)
        if self._build.framework == "np" and str(device) != "cpu":
            raise ValueError("framework=\"numpy\" loads into host memory: device must be \"cpu\"")
        if agent is not None and direct is not None:
            _load_args(framework, "cpu", agent, direct)
        self._agent = agent
        self._direct = direct
        self._prefetch = prefetch
        self._ck = _open(filename)
        self._files = [os.fsdecode(f) for f in self._ck.files]
        self._infos = {t.name: t for t in self._ck.tensors()}
        self._fds: Dict[int, int] = {}
        self._cache: Optional[Dict[str, Any]] = None
        self._closed = False

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the files and drops the handle's hold on a GPU prefetch (tensors already
        returned keep their memory)."""
        self._closed = True
        self._cache = None
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _check(self) -> None:
        if self._closed:
            raise SafetensorError("File is closed")

    def _info(self, name: str) -> "_native.TensorInfo":
        self._check()
        info = self._infos.get(name)
        if info is None:
            raise _CheckpointSafetensorError(f"File does not contain tensor {name}", "checkpoint")
        return info

    def keys(self) -> List[str]:
        """Tensor names, sorted."""
        self._check()
        return sorted(self._infos)

    def offset_keys(self) -> List[str]:
        """Tensor names in the order of their bytes in the files (file by file)."""
        self._check()
        return [t.name for t in sorted(self._infos.values(), key=lambda t: (t.file, t.offset))]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._infos)

    def __contains__(self, name: object) -> bool:
        return name in self._infos

    def metadata(self) -> Optional[Dict[str, str]]:
        """The files' ``__metadata__`` (merged, first file first), or ``None`` if none has one."""
        self._check()
        merged: Dict[str, str] = {}
        for i in range(len(self._ck.files)):
            for k, v in self._ck.metadata(i).items():
                merged.setdefault(k, v)
        return merged or None

    def info(self, name: str) -> "_native.TensorInfo":
        """Dtype, shape, byte count, file and offset of tensor ``name``."""
        return self._info(name)

    def _fd(self, file: int) -> int:
        fd = self._fds.get(file)
        if fd is None:
            # transformers materialises slices from a thread pool: one descriptor per file,
            # the one a racing thread opened second is closed, not leaked.
            new = os.open(self._files[file], os.O_RDONLY | os.O_CLOEXEC)
            fd = self._fds.setdefault(file, new)
            if fd != new:
                os.close(new)
        return fd

    def _host(self, info: "_native.TensorInfo", offset: int = 0, nbytes: Optional[int] = None) -> Any:
        """``nbytes`` bytes of ``info``'s tensor from byte ``offset`` on, read into a new host
        ``uint8`` array."""
        n = info.nbytes - offset if nbytes is None else nbytes
        buf = self._build.host_bytes(n)
        if n:
            _read_at(self._fd(info.file), buf, info.offset + offset, self._files[info.file])
        return buf

    def _to_device(self, t: Any) -> Any:
        if self._build.framework == "pt" and str(self._device) != "cpu":
            dev = f"cuda:{self._device}" if isinstance(self._device, int) else self._device
            return _torch_to(t, dev)
        return t

    def _prefetched(self) -> Optional[Dict[str, Any]]:
        """Every tensor, loaded once into one GPU allocation, when the handle is on a CUDA device
        and prefetches (else ``None``)."""
        if self._cache is None and self._gpu is not None and self._prefetch and self._fits():
            loaded = self._ck.load(self._agent, gpu=self._gpu, direct=self._direct)
            self._cache = {t.name: self._build.tensor(loaded, i, t) for i, t in enumerate(loaded.tensors)}
        return self._cache

    def _fits(self) -> bool:
        try:
            import torch

            free, _ = torch.cuda.mem_get_info(self._gpu)
        except Exception:
            return True  # the load itself reports a GPU it cannot use
        return sum(t.nbytes for t in self._infos.values()) <= 0.9 * free

    def get_tensor(self, name: str) -> Any:
        """Tensor ``name``: on the host, read now with one ``pread`` into a tensor of its own;
        on a CUDA device, a view of the checkpoint's one prefetched allocation (see the class).
        Raises :data:`SafetensorError` (also :class:`gdpath.CheckpointError`) for a name the
        checkpoint does not hold."""
        info = self._info(name)
        cache = self._prefetched()
        if cache is not None:
            return cache[name]
        if self._gpu is not None:
            loaded = self._ck.load(self._agent, gpu=self._gpu, names=[name], direct=self._direct)
            return self._build.tensor(loaded, 0, loaded.tensors[0])
        t = self._build.shaped(self._build.wrap(self._host(info)), info)
        return self._to_device(t)

    def get_slice(self, name: str) -> _Slice:
        """A slice object of tensor ``name`` (nothing read until it is indexed)."""
        return _Slice(self, self._info(name))

    def _slice(self, info: "_native.TensorInfo", index: Any) -> Any:
        self._check()
        if self._build.framework == "pt" and info.dtype != "F4":
            return self._torch_slice(info, index)
        shape = list(info.shape)
        idx = _indexers(index, shape)
        if info.dtype == "F4" and len(idx) == len(shape) and shape and idx[-1][:3] != (0, shape[-1], 1):
            raise SafetensorError("The slice is slicing for subbytes dtypes, and the slice does "
                                  "not end up at a byte boundary, this is invalid.")
        if self._cache is not None:
            whole, first = self._cache[info.name], 0
        elif not shape or (shape[0] and (info.nbytes // shape[0]) * shape[0] != info.nbytes):
            # A 0-d tensor, or rows that are not whole bytes (a 1-D F4 tensor packs two values
            # per byte): read the whole tensor, as get_tensor does.
            whole, first = self._build.shaped(self._build.wrap(self._host(info)), info), 0
        else:
            # Only the rows of the first dimension the index covers are read.
            start, stop = (idx[0][0], idx[0][1]) if idx else (0, shape[0])
            row = info.nbytes // shape[0] if shape[0] else 0
            raw = self._build.wrap(self._host(info, start * row, (stop - start) * row))
            whole = self._build.shaped(raw, _Rows(info, [stop - start] + shape[1:]))
            first = start
        key = tuple(
            a - (first if d == 0 else 0)
            if sel
            else slice(a - (first if d == 0 else 0), b - (first if d == 0 else 0), st)
            for d, (a, b, st, sel) in enumerate(idx)
        )
        out = whole[key] if key else whole
        if self._build.framework == "pt":
            out = _torch_contiguous(out)
            return out if self._cache is not None else self._to_device(out)
        import numpy as np

        # np.ascontiguousarray would make a 0-d result 1-d; safetensors keeps its shape.
        return np.array(out, order="C")

    def _torch_slice(self, info: "_native.TensorInfo", index: Any) -> Any:
        """``tensor[index]`` under PyTorch's indexing rules, as ``safetensors`` indexes a
        ``framework="pt"`` tensor (bounds of a slice clamped, negative ints from the end, any
        index PyTorch takes; its ``IndexError`` / ``ValueError`` otherwise), reading from the
        file only the rows of the first dimension a leading int or slice covers."""
        if self._cache is not None:
            return _torch_contiguous(self._cache[info.name][index])
        shape = list(info.shape)
        rows = _leading_rows(index, shape)
        if rows is None or (shape[0] and (info.nbytes // shape[0]) * shape[0] != info.nbytes):
            whole = self._build.shaped(self._build.wrap(self._host(info)), info)
            return self._to_device(_torch_contiguous(whole[index]))
        (start, stop), index = rows
        row = info.nbytes // shape[0] if shape[0] else 0
        raw = self._build.wrap(self._host(info, start * row, (stop - start) * row))
        part = self._build.shaped(raw, _Rows(info, [stop - start] + shape[1:]))
        return self._to_device(_torch_contiguous(part[index]))

    def tensors(self) -> Iterator[Tuple[str, Any]]:
        """``(name, tensor)`` for every tensor in file order, all loaded with one transfer into
        one allocation."""
        self._check()
        cache = self._prefetched()
        if cache is not None:
            yield from cache.items()
            return
        gpu = self._gpu
        loaded = self._ck.load(self._agent, gpu=gpu, direct=self._direct)
        for i, t in enumerate(loaded.tensors):
            yield t.name, self._to_device(self._build.tensor(loaded, i, t)) if gpu is None else self._build.tensor(loaded, i, t)

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, as :func:`load_file` returns them."""
        return dict(self.tensors())


def _leading_rows(index: Any, shape: Sequence[int]) -> Optional[Tuple[Tuple[int, int], Any]]:
    """The rows ``[start, stop)`` of the first dimension that ``index`` (PyTorch's rules)
    reads, and ``index`` rewritten for a tensor of those rows only; ``None`` (read the whole
    tensor) for a 0-d tensor and for a leading item other than an in-range int, a slice with a
    positive step or an ellipsis that spans the first dimension."""
    if not shape:
        return None
    items = index if isinstance(index, tuple) else (index,)
    first, rest = (items[0], items[1:]) if items else (slice(None), ())
    n = shape[0]
    if first is Ellipsis:
        others = [it for it in rest if it is not None]
        return ((0, n), index) if Ellipsis not in others and len(others) < len(shape) else None
    if type(first) is int:
        if not -n <= first < n:
            return None  # PyTorch's IndexError, from the whole tensor
        at = first % n
        return (at, at + 1), (0,) + tuple(rest)
    if isinstance(first, slice) and all(b is None or type(b) is int for b in (first.start, first.stop, first.step)):
        start, stop, step = first.indices(n)
        if step <= 0:
            return None  # PyTorch's ValueError, from the whole tensor
        stop = max(stop, start)
        return (start, stop), (slice(0, stop - start, step),) + tuple(rest)
    return None


class _Rows:
    """A tensor's description for the rows of it read by a slice: its dtype and name, fewer
    rows."""

    def __init__(self, info: "_native.TensorInfo", shape: List[int]):
        self.name, self.dtype, self.shape = info.name, info.dtype, shape


def _gpu_of_or_none(device: Any) -> Optional[int]:
    """The CUDA ordinal of ``device``, ``None`` for the host and for devices the engine does not
    load to (``"mps"``, ``"xpu"``, ...: those get host tensors moved with ``.to``)."""
    try:
        return _gpu_of(device)
    except ValueError:
        if str(device).split(":")[0] in ("cuda",):
            raise
        return None


def _safe_open_handle(f: Any, framework: str, device: Any = "cpu") -> safe_open:
    """``safetensors._safe_open_handle``: :class:`safe_open` of an open Python file object
    (its ``name``, read as a path: gdpath reads files, not streams). Raises ``TypeError`` for
    an object without a file-system name."""
    name = getattr(f, "name", None)
    if not isinstance(name, (str, bytes, os.PathLike)):
        raise TypeError(f"{type(f).__name__}: gdpath opens a file object by its path (.name)")
    path = os.fsdecode(name)
    if not os.path.isabs(path) and hasattr(f, "fs"):
        path = os.path.abspath(path)
    return safe_open(path, framework, device)


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

        return _same_size_bits(_torch_contiguous(obj.detach())).reshape(-1).view(torch.uint8)
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
    lenient: bool = False,
) -> Dict[str, Any]:
    """Saves ``{name: tensor}`` as the safetensors file ``filename``, as
    ``safetensors.torch.save_file(tensors, filename, metadata)`` does (the same header and data
    order, so either package reads it back the same), from wherever the tensors are: PyTorch
    tensors, CuPy arrays and NumPy arrays, on any GPU or in host memory, mixed. Every dtype of
    the format (bf16, fp8, F4 as ``float4_e2m1fn_x2``, complex64 included) and zero-size
    tensors. PyTorch tensors are refused as ``safetensors.torch`` refuses them: ``ValueError``
    for a sparse or a non-contiguous one, ``RuntimeError`` for tensors sharing memory and for a
    meta tensor; ``lenient=True`` saves those as gdpath did before (a non-contiguous tensor as
    its values, copied contiguous first; tensors sharing memory each whole; a meta tensor is
    still refused, having no data). NumPy and CuPy arrays that are not contiguous are saved as
    their values (``safetensors.numpy.save_file`` 0.8.0 writes such an array's underlying
    buffer instead). NumPy scalars are saved as 0-d tensors and
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
    _refuse_torch(tensors, lenient)
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
        if dtype == "F4" and shape:
            shape[-1] *= 2  # the header counts F4 values; PyTorch packs two per element
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


def _refuse_torch(tensors: Any, lenient: bool) -> None:
    """Raises what ``safetensors.torch.save_file`` raises for ``tensors``' PyTorch tensors:
    ``ValueError`` for a non-dict, a sparse or (unless ``lenient``) a non-contiguous tensor,
    ``RuntimeError`` for a meta tensor and (unless ``lenient``) for tensors sharing memory."""
    if not isinstance(tensors, Mapping):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    pt = {k: v for k, v in tensors.items() if type(v).__module__.startswith("torch")}
    if not pt:
        return
    import torch

    sparse = [k for k, v in pt.items() if v.layout != torch.strided]
    if sparse:
        raise ValueError(f"You are trying to save a sparse tensors: `{sparse}` which this library "
                         "does not support. You can make it a dense tensor before saving with "
                         "`.to_dense()` but be aware this might make a much larger file than needed.")
    for k, v in pt.items():
        if v.device.type == "meta":
            raise RuntimeError(f"tensor {k!r}: Cannot copy out of meta tensor; no data!")
    if lenient:
        return
    from .torch import _find_shared_tensors

    shared = [names for names in _find_shared_tensors(pt) if len(names) > 1]
    if shared:
        raise RuntimeError(f"Some tensors share memory, this will lead to duplicate memory on disk "
                           f"and potential differences when loading them again: {shared}. "
                           "gdpath.safetensors.torch.save_model saves such a model; "
                           "save_file(..., lenient=True) saves each tensor whole.")
    for k, v in pt.items():
        if not v.is_contiguous():
            raise ValueError(f"You are trying to save a non contiguous tensor: `{k}` which is not "
                             "allowed. Call `.contiguous()` on it first, or save_file(..., "
                             "lenient=True) to have it copied.")


# Framework dtype names (PyTorch's and NumPy's `dtype.name`) to the format's, for TensorSpec.
_SPEC_NAMES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float4_e2m1fn_x2": "F4", "complex64": "C64",
}


class TensorSpec:
    """``safetensors.TensorSpec(*, dtype, shape, data_ptr, data_len)``: one tensor for
    :func:`serialize` / :func:`serialize_file` as a raw host address. ``dtype`` is a framework
    name (``"float32"``, ``"bfloat16"``, ``"float4_e2m1fn_x2"``, ...) or a format name
    (``"F32"``); the ``dtype`` property is the format's. For F4 the last dimension of ``shape``
    is doubled (PyTorch's packed shape to the header's count of values). The caller keeps the
    ``data_len`` bytes at ``data_ptr`` alive and unchanged until the call that consumes the spec
    returns (as with ``safetensors``). Raises :data:`SafetensorError` for an unknown dtype."""

    def __init__(self, *, dtype: str, shape: Sequence[int], data_ptr: int, data_len: int):
        code = _SPEC_NAMES.get(dtype, dtype if dtype in _SPEC_NAMES.values() else None)
        if code is None:
            raise SafetensorError(f"dtype {dtype!r} is not one safetensors can save")
        shape = [int(d) for d in shape]
        if code == "F4" and shape:
            shape[-1] *= 2
        if int(data_len) < 0 or int(data_ptr) < 0:
            raise SafetensorError("data_ptr and data_len are not negative")
        self._dtype, self._shape = code, shape
        self._ptr, self._len = int(data_ptr), int(data_len)

    @property
    def dtype(self) -> str:
        """The format's dtype name (``"F32"``, ``"BF16"``, ...)."""
        return self._dtype

    @property
    def shape(self) -> List[int]:
        """The header's shape (F4: values, not packed pairs)."""
        return list(self._shape)

    @property
    def data_ptr(self) -> int:
        """The host address of the tensor's bytes."""
        return self._ptr

    @property
    def data_len(self) -> int:
        """The tensor's length in bytes."""
        return self._len


def _save_specs(
    specs: Any, filename: PathLike, metadata: Optional[Dict[str, str]], fsync: bool
) -> Dict[str, Any]:
    """Saves :class:`TensorSpec` s through the engine's save (one rule for the header with
    :func:`save_file`). ``TypeError`` for a value that is not a ``TensorSpec``."""
    if not isinstance(specs, Mapping):
        raise TypeError(f"{type(specs).__name__}: a dict of name to TensorSpec")
    if metadata is not None and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise TypeError("metadata: keys and values must be str")
    agent = default_agent()
    keep: List[Any] = []
    entries = []
    for name, spec in specs.items():
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"tensor {name!r}: {type(spec).__name__} is not a TensorSpec "
                            "(safetensors 0.8 takes TensorSpec only)")
        if spec.data_len:
            raw = (ctypes.c_ubyte * spec.data_len).from_address(spec.data_ptr)
        else:
            raw = bytearray(1)
        region = agent.register(raw)
        keep.append((raw, region))
        entries.append((name, spec.dtype, spec.shape, region, 0, spec.data_len))
    try:
        return _native.Checkpoint.save(agent, entries, os.fsdecode(filename),
                                       metadata=dict(metadata or {}), fsync=fsync)
    except CheckpointError as e:
        raise _st_error(e) from None


def serialize_file(
    tensor_dict: Dict[str, TensorSpec], filename: PathLike, metadata: Optional[Dict[str, str]] = None
) -> None:
    """``safetensors.serialize_file``: writes :class:`TensorSpec` s as the file ``filename``
    through the engine's crash-safe save (a temporary file, fsynced and renamed over it). The
    GIL is released while the bytes move. Errors as :func:`save_file`; ``TypeError`` for a
    value that is not a ``TensorSpec``."""
    _save_specs(tensor_dict, filename, metadata, fsync=True)


def serialize(tensor_dict: Dict[str, TensorSpec], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """``safetensors.serialize``: the bytes of the file :func:`serialize_file` would write
    (through a scratch file, as ``save``: :func:`_save_bytes`)."""
    need = sum(s.data_len for s in tensor_dict.values() if isinstance(s, TensorSpec)) \
        if isinstance(tensor_dict, Mapping) else 0
    return _scratch_bytes(lambda path: _save_specs(tensor_dict, path, metadata, fsync=False), need)


# safetensors' own limit on a header's length (its MAX_HEADER_SIZE), and the prefix of the
# messages its load(bytes) / deserialize raise.
_MAX_HEADER = 100_000_000
_DESER = "Error while deserializing: "


def _bytes_checkpoint(data: Any) -> Tuple["_native.Checkpoint", memoryview]:
    """The engine's checkpoint of a file held in ``data`` (bytes), its header validated by the
    same code as a file's: the header is written into an anonymous memory file of ``data``'s
    length (the rest a hole, which takes no memory), opened by its ``/proc/self/fd`` path.
    Errors are :data:`SafetensorError` s worded as ``safetensors``' (``Error while
    deserializing: header too small`` / ``header too large`` / ``invalid header length``, then
    the engine's reason for the rest), naming no path: the buffer has none."""
    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise SafetensorError(_DESER + "header too small")
    n = int.from_bytes(view[:8], "little")
    if n > _MAX_HEADER:
        raise SafetensorError(_DESER + "header too large")
    if 8 + n > len(view):
        raise SafetensorError(_DESER + "invalid header length")
    fd = os.memfd_create("gdpath-safetensors", os.MFD_CLOEXEC)
    path = f"/proc/self/fd/{fd}"
    try:
        os.ftruncate(fd, len(view))
        head = view[: 8 + n]
        done = 0
        while done < len(head):
            done += os.pwrite(fd, head[done:], done)
        try:
            ck = _open_paths(path)
        except CheckpointError as e:
            why = e.message[len(path) + 2:] if e.message.startswith(path + ": ") else e.message
            raise _CheckpointSafetensorError(_DESER + _worded(why.replace(path, "the buffer")),
                                             e.kind, e.finding) from None
    finally:
        os.close(fd)
    if _data_end(ck, 0, n) != len(view):
        raise _CheckpointSafetensorError(_DESER + _UNCOVERED, "checkpoint")
    return ck, view


def deserialize(data: bytes) -> List[Tuple[str, Dict[str, Any]]]:
    """``safetensors.deserialize``: ``[(name, {"dtype", "shape", "data"})]`` in file order, the
    header validated as a file's (nothing is allocated past what it allows), ``data`` the
    tensor's bytes (a copy). Raises :data:`SafetensorError` for a malformed buffer."""
    ck, view = _bytes_checkpoint(data)
    out = []
    for t in sorted(ck.tensors(), key=lambda t: t.offset):
        raw = bytes(view[t.offset: t.offset + t.nbytes])
        out.append((t.name, {"dtype": t.dtype, "shape": list(t.shape), "data": raw}))
    return out


# install() / uninstall(): what was replaced, to put back.
_INSTALLED: List[Tuple[Any, str, Any]] = []
_ADDED: List[str] = []


def _ours() -> Dict[str, Any]:
    """Module name → gdpath's module standing in for it (torch's only where PyTorch imports)."""
    import importlib
    import sys

    out = {"safetensors": sys.modules[__name__],
           "safetensors.numpy": importlib.import_module(__name__ + ".numpy")}
    try:
        out["safetensors.torch"] = importlib.import_module(__name__ + ".torch")
    except ImportError:
        pass
    return out


def install() -> None:
    """Routes ``safetensors`` through gdpath in this process, for programs that cannot be
    edited: every public function and class of ``safetensors``, ``safetensors.torch`` and
    ``safetensors.numpy`` that gdpath has is replaced by gdpath's on those modules (so a later
    ``from safetensors.torch import load_file`` gets gdpath's), and every name other modules
    already imported from them (``transformers.modeling_utils.safe_open``, ``load_file``, ...)
    is rebound, found by identity in every loaded module. Where ``safetensors`` is not
    installed, gdpath's modules are registered under its names. Idempotent; :func:`uninstall`
    puts everything back. Limits: references held elsewhere than a module's globals (a
    dict, a closure, a ``functools.partial``) keep the originals; ``SafetensorError`` is left
    as it is (gdpath raises that very class). ``python -m gdpath.safetensors.run prog.py``
    calls this before running ``prog.py``."""
    import importlib
    import sys

    if _INSTALLED or _ADDED:
        return
    swap: Dict[int, Any] = {}
    for modname, ours in _ours().items():
        try:
            real = importlib.import_module(modname)
        except ImportError:
            real = None
        if real is None or real is ours:
            if modname not in sys.modules:
                sys.modules[modname] = ours
                _ADDED.append(modname)
            continue
        for attr, new in vars(ours).items():
            if attr.startswith("__") or attr == "SafetensorError" or not callable(new):
                continue
            old = getattr(real, attr, None)
            if old is None or old is new or not callable(old):
                continue
            swap[id(old)] = (old, new)
            _INSTALLED.append((real, attr, old))
            setattr(real, attr, new)
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict) or getattr(mod, "__name__", "").startswith(("safetensors", __name__)):
            continue
        for attr, val in list(d.items()):
            hit = swap.get(id(val))
            if hit is not None and hit[0] is val:
                _INSTALLED.append((mod, attr, val))
                d[attr] = hit[1]


def uninstall() -> None:
    """Undoes :func:`install`: every replaced name gets its original back and modules gdpath
    registered under ``safetensors``' names are removed. Names a program bound itself while
    installed keep gdpath's."""
    import sys

    while _INSTALLED:
        mod, attr, old = _INSTALLED.pop()
        setattr(mod, attr, old)
    while _ADDED:
        sys.modules.pop(_ADDED.pop(), None)


def _save_bytes(tensors: Any, metadata: Optional[Dict[str, str]], lenient: bool = False) -> bytes:
    """The bytes of the file :func:`save_file` would write for ``tensors`` (``save`` of
    ``.torch`` and ``.numpy``): the engine's save writes a whole file and renames it into
    place, so the bytes go through a scratch file, without fsync, in ``/dev/shm`` (memory) where
    it has room for them, else in the system's temporary directory, read back and removed."""
    need = sum(int(getattr(t, "nbytes", 0)) for t in tensors.values()) if isinstance(tensors, Mapping) else 0
    return _scratch_bytes(lambda p: save_file(tensors, p, metadata, fsync=False, lenient=lenient), need)


def _scratch_bytes(write: Any, need: int) -> bytes:
    """The bytes of the file ``write(path)`` saves, through a scratch directory removed
    afterwards: in ``/dev/shm`` where it has ``need`` bytes and 1 MiB free (containers often
    give it 64 MiB), else in :func:`tempfile.gettempdir`."""
    scratch = None
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= need + (1 << 20):
            scratch = "/dev/shm"
    except OSError:
        pass
    with tempfile.TemporaryDirectory(prefix="gdpath-st-", dir=scratch) as d:
        path = os.path.join(d, "t.safetensors")
        write(path)
        with open(path, "rb") as f:
            return f.read()


def _load_bytes(data: Any, framework: str) -> Dict[str, Any]:
    """``{name: tensor}`` of a file held in ``data``, in file order, each a host copy (``load``
    of ``.torch`` and ``.numpy``)."""
    import numpy as np

    build = _Builder(framework)
    ck, view = _bytes_checkpoint(data)
    out = {}
    for t in sorted(ck.tensors(), key=lambda t: t.offset):
        raw = np.frombuffer(view, dtype=np.uint8, count=t.nbytes, offset=t.offset).copy()
        out[t.name] = build.shaped(build.wrap(raw), t)
    return out
