"""``python -m gdpath.safetensors.run prog.py [args]`` (or ``-m module [args]``): runs a program
with ``safetensors`` routed through gdpath (:func:`gdpath.safetensors.install` first), for
programs that cannot be edited."""

from __future__ import annotations

import runpy
import sys

from . import install


def main(argv: list) -> None:
    """Installs gdpath's safetensors, then runs ``argv`` (a script path, or ``-m`` and a module)
    as ``__main__`` with ``sys.argv`` set to it. Exits 2 with a usage line for no program."""
    if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
        sys.stderr.write("usage: python -m gdpath.safetensors.run (prog.py | -m module) [args]\n")
        raise SystemExit(2)
    install()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
