"""Run at interpreter start by ``gdpath_safetensors.pth`` (installed with the wheel) when
``GDPATH_SAFETENSORS=1``: :func:`gdpath.safetensors.install` for programs that cannot be edited.
Without the variable the ``.pth`` line imports nothing (no gdpath, no PyTorch)."""

from __future__ import annotations

import sys

try:
    from . import install

    install()
except Exception as e:  # the program still runs, on safetensors itself, and says why
    sys.stderr.write(f"gdpath: GDPATH_SAFETENSORS=1 but gdpath.safetensors.install() failed: {e!r}; "
                     "safetensors is not routed through gdpath\n")
