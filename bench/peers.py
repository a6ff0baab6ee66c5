"""The peers' adapters that bench/'s baseline scripts share, in one place: each checkpoint loader
takes the path of a safetensors file and returns {tensor name: torch tensor on cuda:0}, so that
the scripts time and verify every loader alike; beside them the KvikIO read, the page-cache
drop that cold runs start with, and the size arguments' parser. What one script alone measures stays in it (the savers in
save_baselines.py, NIXL in kv_blocks.py, PyTorch's copies in torch_copy.py), and the anchors/
scripts are kept as they ran.

Each peer's package is imported inside its adapter: a script runs with whichever wheels were
carried, and a peer that does not import is a row that says so (an ImportError), not the end of
the run. The scripts import this module by name (`import peers`): Python puts the directory of
the script it runs, bench/, first on sys.path.

Peers (the versions measured are in docs/benchmarks.md): safetensors, fastsafetensors (nogds),
Run:ai Model Streamer, InstantTensor (its default backend and BackendPolicy.BUFFERED), KvikIO
(POSIX mode), and gdpath's own `gdpath.safetensors.load_file`.
"""

from __future__ import annotations

import json
import os
import struct


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(s: str) -> int:
    """Bytes of a size argument: a number of bytes, or one with B, KiB, MiB or GiB after it
    ("16KiB", "1.5GiB")."""
    for u in sorted(UNITS, key=len, reverse=True):
        if s.endswith(u):
            return int(float(s[: -len(u)]) * UNITS[u])
    return int(s)


def drop_cache(path: str) -> str:
    """Drops `path` from the page cache before a cold run: `echo 3 > /proc/sys/vm/drop_caches`
    (all of the cache) where allowed (root), else posix_fadvise(DONTNEED) on the file alone.
    Dirty pages are written back first (sync), since neither drops them. Returns which worked:
    "drop_caches" or "fadvise"."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return "fadvise"


def llama_shapes(h: int, i: int, kv: int, v: int, layers: int) -> dict:
    """Name → shape of a Llama-shaped checkpoint in transformers' names (hidden `h`,
    intermediate `i`, K/V width `kv`, vocabulary `v`, `layers` layers; untied lm_head): the
    checkpoint of python_load.py and safetensors_dropin.py."""
    out = {"model.embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "model.norm.weight": (h,)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        for n, s in (("self_attn.q_proj", (h, h)), ("self_attn.k_proj", (kv, h)),
                     ("self_attn.v_proj", (kv, h)), ("self_attn.o_proj", (h, h)),
                     ("mlp.gate_proj", (i, h)), ("mlp.up_proj", (i, h)), ("mlp.down_proj", (h, i)),
                     ("input_layernorm", (h,)), ("post_attention_layernorm", (h,))):
            out[p + n + ".weight"] = s
    return out


# --- checkpoint loaders: each returns {name: tensor on cuda:0} --------------------------------


def gdpath_load(p):
    """gdpath's Python loader (`gdpath.safetensors.load_file`), the storage chooser's settings."""
    import gdpath.safetensors

    return gdpath.safetensors.load_file(p, device="cuda:0")


def safetensors_load(p):
    """safetensors' own loader (`safetensors.torch.load_file`): also every script's reference."""
    from safetensors.torch import load_file

    return load_file(p, device="cuda:0")


def fastsafetensors_load(p):
    """fastsafetensors without GDS (`nogds=True`); each tensor cloned out of the loader's buffer,
    which `close()` frees."""
    from fastsafetensors import SafeTensorsFileLoader

    ld = SafeTensorsFileLoader(None, "cuda:0", nogds=True)
    ld.add_filenames({0: [p]})
    fb = ld.copy_files_to_device()
    d = {k: fb.get_tensor(k).clone() for k in ld.get_keys()}
    ld.close()
    return d


def runai_load(p, clone=False):
    """Run:ai Model Streamer (`SafetensorsStreamer`). `clone=True` copies each tensor as it
    arrives (storage_device.py's rows, which pay that copy); python_load.py keeps the streamer's
    tensors as they are."""
    from runai_model_streamer import SafetensorsStreamer

    d = {}
    with SafetensorsStreamer() as s:
        s.stream_file(p, device="cuda:0")
        for n, x in s.get_tensors():
            d[n] = x.clone() if clone else x
    return d


def instanttensor_load(p, backend=None):
    """InstantTensor's `safe_open` with its default backend, or `backend` (a BackendPolicy)."""
    from instanttensor import safe_open

    d = {}
    kw = {"backend": backend} if backend is not None else {}
    with safe_open(p, framework="pt", device=0, **kw) as f:
        for n, x in f.tensors():
            d[n] = x
    return d


def instanttensor_buffered_load(p):
    """InstantTensor with `BackendPolicy.BUFFERED` (page-cache reads)."""
    from instanttensor import BackendPolicy

    return instanttensor_load(p, BackendPolicy.BUFFERED)


def kvikio_load(p):
    """KvikIO: the whole file into one GPU buffer (POSIX mode; its threads and task size come
    from KVIKIO_* in the environment, `kvikio_env`), tensors as views of it."""
    import torch

    size = os.path.getsize(p)
    buf = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    kvikio_read(p, buf)
    with open(p, "rb") as f:
        (hl,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hl))
    dt = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    d = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        d[k] = buf[8 + hl + b : 8 + hl + e].view(dt[v["dtype"]]).view(v["shape"])
    return d


# --- KvikIO ------------------------------------------------------------------------------------


def kvikio_env(threads: int, task_bytes: int) -> dict:
    """The environment of a child process that reads with KvikIO in POSIX (compat) mode with
    `threads` threads and tasks of `task_bytes`: KvikIO reads KVIKIO_* once, at import, so each
    setting needs a process of its own."""
    return dict(
        os.environ,
        KVIKIO_COMPAT_MODE="ON",
        KVIKIO_NTHREADS=str(threads),
        KVIKIO_TASK_SIZE=str(task_bytes),
    )


def kvikio_read(path: str, buf) -> int:
    """Reads the file at `path` into the GPU buffer `buf` (a CuPy array, or anything
    `cupy.asarray` takes, such as a torch CUDA tensor) with `kvikio.CuFile.read`, then waits for
    the GPU. Returns the bytes read."""
    import cupy
    import kvikio

    with kvikio.CuFile(path, "r") as fh:
        n = fh.read(cupy.asarray(buf))
    cupy.cuda.runtime.deviceSynchronize()
    return n


def kvikio_compat_mode() -> str | None:
    """KvikIO's compat mode as it reports it, else as KVIKIO_COMPAT_MODE asked (the call moved
    between KvikIO releases)."""
    import kvikio

    try:
        return str(kvikio.defaults.compat_mode())
    except Exception:
        return os.environ.get("KVIKIO_COMPAT_MODE")
