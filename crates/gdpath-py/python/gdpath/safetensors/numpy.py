"""``safetensors.numpy`` through gdpath: :func:`save`, :func:`save_file`, :func:`load`,
:func:`load_file` with that module's signatures, on NumPy arrays in host memory. Files are
byte-identical to ``safetensors.numpy``'s for the same contiguous arrays (docs/python.md)."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Union

# The names safetensors.torch / safetensors.numpy re-export from safetensors itself.
from . import SafetensorError, TensorSpec, deserialize, safe_open, serialize, serialize_file  # noqa: F401
from . import _load_bytes, _save_bytes
from . import load_file as _load_file
from . import save_file as _save_file

__all__ = ["load", "load_file", "save", "save_file"]


def save(tensor_dict: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The safetensors file of ``{name: array}`` as bytes (what :func:`save_file` writes).
    Errors as :func:`gdpath.safetensors.save_file`."""
    return _save_bytes(tensor_dict, metadata)


def save_file(
    tensor_dict: Dict[str, Any],
    filename: Union[str, "os.PathLike[str]"],
    metadata: Optional[Dict[str, str]] = None,
) -> None:
    """Saves ``{name: array}`` as ``filename`` through gdpath's crash-safe save (a temporary,
    fsynced, renamed over it). Errors as :func:`gdpath.safetensors.save_file`."""
    _save_file(tensor_dict, filename, metadata)


def load(data: bytes) -> Dict[str, Any]:
    """``{name: array}`` of a safetensors file held in ``data``, each a copy, in file order.
    Raises :data:`gdpath.safetensors.SafetensorError` for a malformed buffer, ``TypeError`` for
    a dtype NumPy lacks (bf16, fp8)."""
    return _load_bytes(data, "numpy")


def load_file(filename: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """``{name: array}`` of the file, loaded by gdpath's engine into one host allocation
    (:func:`gdpath.safetensors.load_file` with ``framework="numpy"``)."""
    return _load_file(filename, framework="numpy")
