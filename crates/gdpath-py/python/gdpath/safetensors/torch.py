"""``safetensors.torch`` through gdpath: :func:`save`, :func:`save_file`, :func:`load`,
:func:`load_file`, :func:`save_model`, :func:`load_model` and the helpers programs import from
it (:func:`storage_ptr`, :func:`storage_size`, ``_end_ptr``, ``_find_shared_tensors``,
``_filter_shared_not_shared``, ``_is_complete``, ``_remove_duplicate_names``), with that
module's signatures, results and refusals. Importing it imports
PyTorch (``ImportError`` without it); ``gdpath.safetensors`` itself does not."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

import torch

# The names safetensors.torch / safetensors.numpy re-export from safetensors itself.
from . import SafetensorError, TensorSpec, deserialize, safe_open, serialize, serialize_file  # noqa: F401
from . import _load_bytes, _save_bytes, _torch_contiguous
from . import load_file as _load_file
from . import save_file as _save_file

__all__ = ["load", "load_file", "load_model", "save", "save_file", "save_model",
           "storage_ptr", "storage_size"]

Path = Union[str, "os.PathLike[str]"]


def storage_ptr(tensor: torch.Tensor) -> int:
    """The address of the storage under ``tensor`` (0 for a meta tensor, which has none)."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor: torch.Tensor) -> int:
    """The byte length of the storage under ``tensor`` (its own bytes for a meta tensor)."""
    try:
        return int(tensor.untyped_storage().nbytes())
    except (NotImplementedError, RuntimeError):
        return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor: torch.Tensor) -> int:
    """The address one byte past ``tensor``'s last element (its :meth:`data_ptr` when it has
    none), as ``safetensors.torch._end_ptr``: for ``B[::4]`` of a float32 ``B``, three strides
    of 16 bytes and one element of 4 past its start. Strides are counted as they are, so a
    non-contiguous tensor (which ``safetensors`` cannot flatten there) gets its true end too."""
    start = tensor.data_ptr()
    if tensor.nelement() == 0:
        return start
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    return start + (last + 1) * tensor.element_size()


def _filter_shared_not_shared(
    tensors: List[Set[str]], state_dict: Dict[str, torch.Tensor]
) -> List[Set[str]]:
    """Splits each set of names sharing a storage into the groups whose byte spans overlap
    (``[data_ptr, _end_ptr)``, chained: A overlapping B overlapping C is one group), in address
    order; sets of one name are kept as they are. ``safetensors`` chains on the previous span's
    end only, which can split a group under one long tensor; here a group ends only past the
    furthest end seen, so no two overlapping tensors land in different groups."""
    out: List[Set[str]] = []
    for names in tensors:
        if len(names) < 2:
            out.append(names)
            continue
        spans = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in names)
        end = None
        for a, b, n in spans:
            if end is not None and a < end:
                out[-1].add(n)
                end = max(end, b)
            else:
                out.append({n})
                end = b
    return out


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """The tensors of ``state_dict`` as groups whose bytes overlap, as
    ``safetensors.torch._find_shared_tensors``: one set per group, singletons included, storages
    in the order the dict first names them, groups of one storage in address order; meta and
    empty-storage tensors are left out."""
    by_storage: Dict[Tuple[Any, int, int], Set[str]] = defaultdict(set)
    for k, v in state_dict.items():
        if v.device.type != "meta" and storage_ptr(v) != 0 and storage_size(v) != 0:
            # The device is part of the key: two GPUs may hand out the same address.
            by_storage[(v.device, storage_ptr(v), storage_size(v))].add(k)
    return _filter_shared_not_shared(list(by_storage.values()), state_dict)


def _is_complete(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` starts at its storage's start and its elements' bytes add up to the
    storage's size (``True`` for a meta tensor), as ``safetensors.torch._is_complete``; a
    strided view with holes (``A[::2]``) is not complete."""
    return (tensor.data_ptr() == storage_ptr(tensor)
            and tensor.nelement() * tensor.element_size() == storage_size(tensor))


def _remove_duplicate_names(
    state_dict: Dict[str, torch.Tensor],
    *,
    preferred_names: Optional[Iterable[str]] = None,
    discard_names: Optional[Iterable[str]] = None,
) -> Dict[str, List[str]]:
    """For each group of tensors sharing memory, the name to keep → the others, sorted, as
    ``safetensors.torch._remove_duplicate_names``. The kept one covers its whole storage
    (:func:`_is_complete`): among those, the first by name of ``preferred_names``, else of
    those not in ``discard_names``, else of all. ``RuntimeError`` where none covers it (saving
    a view would write more or less than the model holds)."""
    preferred, discard = set(preferred_names or ()), set(discard_names or ())
    out: Dict[str, List[str]] = defaultdict(list)
    for group in _find_shared_tensors(state_dict):
        complete = sorted(n for n in group if _is_complete(state_dict[n]))
        if not complete:
            raise RuntimeError(f"Error while trying to find names to remove to save state dict, "
                               f"but found no suitable name to keep for saving amongst: {group}. "
                               "None is covering the entire storage.Refusing to save/load the "
                               "model since you could be storing much more memory than needed.")
        keep = ([n for n in complete if n in preferred] or [n for n in complete if n not in discard]
                or complete)[0]
        for n in sorted(group):
            if n != keep:
                out[keep].append(n)
    return out


def _refuse_non_tensors(tensors: Any) -> None:
    """``ValueError`` with ``safetensors.torch``'s words for a non-dict or a value that is not
    a ``torch.Tensor`` (this module saves PyTorch tensors only, as that one does)."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    for k, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None, *,
         lenient: bool = False) -> bytes:
    """The safetensors file of ``tensors`` as bytes (what :func:`save_file` writes), from host
    or GPU tensors. Refusals and ``lenient`` as :func:`save_file`."""
    _refuse_non_tensors(tensors)
    return _save_bytes(tensors, metadata, lenient)


def save_file(tensors: Dict[str, torch.Tensor], filename: Path,
              metadata: Optional[Dict[str, str]] = None, *, lenient: bool = False) -> None:
    """Saves ``tensors`` as ``filename`` through gdpath's crash-safe save, straight from where
    they are (GPU or host). Raises as ``safetensors.torch.save_file``: ``ValueError`` for a
    sparse or non-contiguous tensor, ``RuntimeError`` for shared memory or a meta tensor;
    ``lenient=True`` copies non-contiguous tensors and saves shared ones whole
    (:func:`gdpath.safetensors.save_file`)."""
    _refuse_non_tensors(tensors)
    _save_file(tensors, filename, metadata, lenient=lenient)


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """``{name: tensor}`` of a safetensors file held in ``data``: host tensors, each a copy, in
    file order. Raises :data:`gdpath.safetensors.SafetensorError` for a malformed buffer."""
    return _load_bytes(data, "pt")


def load_file(filename: Path, device: Union[str, int] = "cpu", *,
              backend: str = "mmap") -> Dict[str, torch.Tensor]:
    """``{name: tensor}`` of the file on ``device``, loaded by gdpath's engine into one
    allocation (:func:`gdpath.safetensors.load_file`)."""
    return _load_file(filename, device, backend=backend)


def save_model(model: torch.nn.Module, filename: str, metadata: Optional[Dict[str, str]] = None,
               force_contiguous: bool = True) -> None:
    """Saves ``model.state_dict()``, keeping one name of each group of tensors sharing memory
    (the others recorded in the metadata as ``dropped → kept``), as ``safetensors.torch``."""
    state = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state).items():
        for name in dropped:
            metadata = dict(metadata or {})
            metadata.setdefault(name, kept)
            del state[name]
    if force_contiguous:
        state = {k: _torch_contiguous(v) for k, v in state.items()}
    try:
        save_file(state, filename, metadata)
    except ValueError as e:
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True).") from None


def load_model(model: torch.nn.Module, filename: Path, strict: bool = True,
               device: Union[str, int] = "cpu", *, backend: str = "mmap") -> Tuple[List[str], List[str]]:
    """Loads ``filename`` into ``model`` (names dropped by :func:`save_model` for shared memory
    count as loaded); returns ``(missing, unexpected)``, ``RuntimeError`` for either when
    ``strict``, as ``safetensors.torch.load_model``."""
    state = load_file(filename, device=device, backend=backend)
    dropped = _remove_duplicate_names(model.state_dict(), preferred_names=state.keys())
    missing_l, unexpected = model.load_state_dict(state, strict=False)
    missing = set(missing_l)
    unexpected = list(unexpected)
    for names in dropped.values():
        for n in names:
            if n in missing:
                missing.remove(n)
            else:
                unexpected.append(n)
    if strict and (missing or unexpected):
        msg = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            msg += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            msg += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(msg)
    return sorted(missing), unexpected
