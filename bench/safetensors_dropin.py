#!/usr/bin/env python3
"""gdpath.safetensors as a drop-in (issue 39's benchmark): the ways real programs load a sharded
Llama-shaped bf16 checkpoint (9.08 GB, 147 tensors, Llama-3-8B's widths with 16 layers, in
shards of `--shard-gb` like a Hugging Face repository: `model-0000i-of-0000n.safetensors` and
`model.safetensors.index.json`, with a `config.json` for transformers) onto cuda:0, plain and
through gdpath, in one process and interleaved rounds:

  (a) transformers `from_pretrained(dir, device_map="cuda:0")`: plain, and through
      `gdpath.safetensors.install()` (uninstalled after each load);
  (b) the vLLM / SGLang loop, `safe_open(shard, framework="pt", device="cuda:0")` then
      `get_tensor(name)` for every key: safetensors' and gdpath's; InstantTensor (a row saying
      why where it does not import), whose `safe_open` has no `get_tensor`, the way its docs
      load every tensor: one `safe_open(shards, framework="pt", device=0)` over the list of
      shards, iterating `tensors()`;
  (c) `gdpath.safetensors.load_file(index, device="cuda:0")`, and a pinned H2D copy of the same
      number of bytes (the PCIe reference of this run).

Every load is verified: each tensor equal (torch.equal, on the GPU) to the reference that
`safetensors.torch.load_file` loaded, name, dtype and shape included (for (a), the model's
state dict). GB/s = checkpoint tensor bytes / wall seconds of the call (1e9 B/s), with
`torch.cuda.synchronize()` on both sides; min / median / max over `--rounds` rounds (each loader
once per round, the order rotating), after one untimed warm-up load of each (the one-time setup
a serving process pays once), each timed load `--settle` s after the previous one's tensors were
freed (bench/python_load.py says why). The ratios to the issue's targets are computed from the
medians: (a) gdpath / plain >= 3; (b) gdpath loop / gdpath load_file >= 0.85 and gdpath loop /
InstantTensor loop >= 1.1; (c) load_file / InstantTensor loop >= 1.1 and load_file / pinned H2D
>= 0.9.

The checkpoint's data is a 64 MB block of finite bf16 values (random, fixed seed) laid over each
tensor from a rotation of its own, so that tensors differ from each other and a byte read from
the wrong place differs from the right one; the files are written once (about 10 s on tmpfs) and
reused while their sizes match.

GPU memory: the reference (9.08 GB) and one load at a time (9.08 GB; transformers' model the
same), under 25 GB. Runtime on an H100: about 3 minutes with the default 3 rounds (plain
transformers, about 9.4 s a load, is most of it: 4 loads with the warm-up). `--quick`: one
round, no warm-up, so the first load of each loader also pays one-time setup (CUDA context,
gdpath's pinned slabs): a smoke test, its rates and ratios are not results.

`--dry-run` (no PyTorch needed, for a machine without a GPU): a 1/64-size F16 checkpoint loaded
on the host with NumPy by (b) and (c) (`framework="numpy"`), verified against
`safetensors.numpy`; transformers and the pinned copy are rows saying they were skipped. It
exercises the checkpoint writer, the rounds, the verification, the ratios and the JSON.

Usage (GPU machine, gdpath's wheel installed; InstantTensor's wheel carried if wanted):
    python3 bench/safetensors_dropin.py [--dir /dev/shm/gdpath-dropin] [--rounds 3] [--quick]
        [--settle 1] [--shard-gb 2] [--only NAME,...] [--out OUT.json]
    python3 bench/safetensors_dropin.py --dry-run --out /tmp/dropin.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import numpy as np

import peers  # bench/, first on sys.path when this script runs

# Llama-3-8B's widths, 16 layers: 147 tensors, 9.08 GB in bf16 (bench/python_load.py's shapes).
FULL = dict(h=4096, i=14336, kv=1024, v=128256, layers=16, heads=32, kv_heads=8)
DRY = dict(h=512, i=1792, kv=128, v=16032, layers=2, heads=4, kv_heads=1)
BLOCK_BYTES = 64_000_006  # the pattern's period: not a power of two, so no tensor offset repeats it


def shapes(c: dict) -> dict:
    """Name → shape of the Llama-shaped checkpoint, in transformers' names."""
    return peers.llama_shapes(c["h"], c["i"], c["kv"], c["v"], c["layers"])


def pattern(dtype: str) -> bytes:
    """BLOCK_BYTES of finite values of ``dtype`` (BF16: float32 normals' upper halves; F16)."""
    x = np.random.default_rng(39).standard_normal(BLOCK_BYTES // 2).astype(np.float32)
    if dtype == "BF16":
        return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return x.astype(np.float16).tobytes()


def write_checkpoint(d: str, c: dict, dtype: str, shard_bytes: int) -> dict:
    """Writes the shards, the index and config.json into ``d`` (skipped where the index says the
    same total size); returns the index."""
    os.makedirs(d, exist_ok=True)
    names = shapes(c)
    size = {n: int(np.prod(s)) * 2 for n, s in names.items()}
    total = sum(size.values())
    index_path = os.path.join(d, "model.safetensors.index.json")
    try:
        with open(index_path) as f:
            old = json.load(f)
        if old["metadata"]["total_size"] == total and all(
                os.path.isfile(os.path.join(d, s)) for s in set(old["weight_map"].values())):
            return old
    except (OSError, ValueError, KeyError):
        pass
    shards, cur, acc = [], [], 0
    for n in names:
        if cur and acc + size[n] > shard_bytes:
            shards.append(cur)
            cur, acc = [], 0
        cur.append(n)
        acc += size[n]
    shards.append(cur)
    block = pattern(dtype)
    weight_map = {}
    for k, members in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for n in members:
            header[n] = {"dtype": dtype, "shape": list(names[n]), "data_offsets": [off, off + size[n]]}
            off += size[n]
            weight_map[n] = fname
        hj = json.dumps(header, separators=(",", ":")).encode()
        hj += b" " * (-len(hj) % 8)  # data starts 8-aligned, as safetensors writes it
        with open(os.path.join(d, fname), "wb") as f:
            f.write(len(hj).to_bytes(8, "little") + hj)
            for n in members:
                rot = (list(names).index(n) * 7_919_001 * 2) % BLOCK_BYTES
                left = size[n]
                while left:
                    piece = block[rot: rot + left] if rot else block[:left]
                    f.write(piece)
                    left -= len(piece)
                    rot = 0
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(index_path, "w") as f:
        json.dump(index, f, indent=1)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "hidden_size": c["h"], "intermediate_size": c["i"], "num_hidden_layers": c["layers"],
              "num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"],
              "vocab_size": c["v"], "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
              "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "dtype": "bfloat16", "attention_bias": False, "mlp_bias": False}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return index


def stats(g, digits: int = 2):
    g = sorted(g)
    return {"min": round(g[0], digits), "median": round(statistics.median(g), digits),
            "max": round(g[-1], digits)}


class Skip(Exception):
    """A loader that cannot run here (a package missing, no GPU): its row says why."""


def loaders(d: str, shards: list, dry: bool):
    """Name → (group, function returning {name: tensor}) of every load measured."""
    dev = "cpu" if dry else "cuda:0"
    fw = "numpy" if dry else "pt"
    files = [os.path.join(d, s) for s in shards]

    def loop(safe_open, **kw):
        out = {}
        for f in files:
            with safe_open(f, framework=fw, device=kw.get("device", dev)) as h:
                for k in h.keys():
                    out[k] = h.get_tensor(k)
        return out

    def st_loop():
        from safetensors import safe_open

        return loop(safe_open)

    def it_loop():
        # InstantTensor 0.2's safe_open has no get_tensor: its documented way to load every
        # tensor is one safe_open over the list of shards, iterating tensors() (copy=True, the
        # default: each tensor owns its memory past the with block).
        try:
            from instanttensor import safe_open
        except ImportError as e:
            raise Skip(f"InstantTensor does not import: {e}") from None
        if dry:
            raise Skip("InstantTensor loads onto a GPU only")
        out = {}
        with safe_open(files, framework="pt", device=0) as h:
            for k, t in h.tensors():
                out[k] = t
        return out

    def gd_loop():
        import gdpath.safetensors as g

        return loop(g.safe_open)

    def gd_load_file():
        import gdpath.safetensors as g

        return g.load_file(os.path.join(d, "model.safetensors.index.json"), device=dev, framework=fw)

    def tf(installed: bool):
        def run():
            if dry:
                raise Skip("transformers needs PyTorch and a GPU (dry run)")
            try:
                import torch
                import transformers
            except ImportError as e:
                raise Skip(f"transformers does not import: {e}") from None
            import gdpath.safetensors as g

            key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
            if installed:
                g.install()
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    d, device_map="cuda:0", **{key: torch.bfloat16})
            finally:
                g.uninstall()
            return model.state_dict()
        return run

    return {
        "(a) transformers from_pretrained": ("a", tf(False)),
        "(a) transformers from_pretrained + gdpath install()": ("a", tf(True)),
        "(b) safetensors safe_open loop": ("b", st_loop),
        "(b) instanttensor safe_open loop": ("b", it_loop),
        "(b) gdpath safe_open loop": ("b", gd_loop),
        "(c) gdpath load_file": ("c", gd_load_file),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/dev/shm/gdpath-dropin", help="where the checkpoint is (made if missing)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round, no warm-up")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds between one load's free and the next")
    ap.add_argument("--shard-gb", type=float, default=2.0, help="the largest shard, GB (1e9 B)")
    ap.add_argument("--only", default="", help="comma-separated substrings of the loaders' names")
    ap.add_argument("--dry-run", action="store_true", help="host, NumPy, a 1/64-size F16 checkpoint")
    ap.add_argument("--out", default=None, help="the JSON results (default $OUT/safetensors_dropin.json)")
    a = ap.parse_args()
    rounds, warmup = (1, 0) if a.quick else (a.rounds, 1)
    dry = a.dry_run
    d = a.dir + ("-dry" if dry else "")

    t0 = time.perf_counter()
    index = write_checkpoint(d, DRY if dry else FULL, "F16" if dry else "BF16", int(a.shard_gb * 1e9 / (64 if dry else 1)))
    shards = sorted(set(index["weight_map"].values()))
    nb = index["metadata"]["total_size"]
    print(f"checkpoint {d}: {nb} tensor bytes, {len(index['weight_map'])} tensors, {len(shards)} shards "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)

    if dry:
        import safetensors.numpy as snp

        ref = {}
        for s in shards:
            ref.update(snp.load_file(os.path.join(d, s)))

        def equal(x, y):
            return x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)

        def sync():
            pass

        def free():
            gc.collect()
    else:
        import torch
        from safetensors.torch import load_file

        torch.zeros(1, device="cuda:0")
        ref = {}
        for s in shards:
            ref.update(load_file(os.path.join(d, s), device="cuda:0"))

        def equal(x, y):
            return x.dtype == y.dtype and x.shape == y.shape and x.device == y.device and torch.equal(x, y)

        def sync():
            torch.cuda.synchronize()

        def free():
            gc.collect()
            torch.cuda.empty_cache()

    def verified(got) -> bool:
        return set(got) == set(ref) and all(equal(got[k], ref[k]) for k in ref)

    res = {"bytes": nb, "tensors": len(ref), "shards": len(shards), "dry_run": dry, "rounds": rounds,
           "settle_s": a.settle, "rows": {}}
    try:
        import gdpath

        res["gdpath_backends"] = gdpath.default_agent().backends
    except Exception as e:  # reported, not fatal: the gdpath rows will say what failed
        res["gdpath_backends"] = repr(e)[:200]

    # The pinned H2D rate of this run: the checkpoint's byte count, pinned host → cuda:0.
    if dry:
        res["rows"]["(c) pinned H2D copy"] = {"skipped": "no GPU (dry run)"}
    else:
        src = torch.empty(nb, dtype=torch.uint8).pin_memory()
        dst = torch.empty(nb, dtype=torch.uint8, device="cuda:0")
        g = []
        for _ in range(rounds + 1):
            sync()
            t = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            sync()
            g.append(nb / (time.perf_counter() - t) / 1e9)
        res["rows"]["(c) pinned H2D copy"] = {**stats(g[1:] or g), "runs": [round(x, 2) for x in g[1:] or g]}
        del src, dst
        free()
        print("(c) pinned H2D copy", res["rows"]["(c) pinned H2D copy"], flush=True)

    chosen = [(n, fn) for n, (_, fn) in loaders(d, shards, dry).items()
              if not a.only or any(o in n for o in a.only.split(","))]
    acc = {n: {"gbps": [], "secs": [], "ok": True, "error": None, "skipped": None} for n, _ in chosen}

    def one(name, fn, timed: bool):
        r = acc[name]
        got = None
        try:
            sync()
            if timed:
                time.sleep(a.settle)
            t = time.perf_counter()
            got = fn()
            sync()
            dt = time.perf_counter() - t
            if timed:
                r["secs"].append(dt)
                r["gbps"].append(nb / dt / 1e9)
            r["ok"] = r["ok"] and verified(got)
        except Skip as e:
            r["skipped"] = str(e)
        except Exception as e:  # a loader failing is its row's error, not the end of the run
            r["error"] = repr(e)[:300]
        finally:
            del got
            free()

    for name, fn in chosen:
        for _ in range(warmup):
            one(name, fn, timed=False)
    for rnd in range(rounds):
        k = rnd % len(chosen)
        for name, fn in chosen[k:] + chosen[:k]:
            if not (acc[name]["error"] or acc[name]["skipped"]):
                one(name, fn, timed=True)
    for name, _ in chosen:
        r, row = acc[name], {}
        if r["gbps"]:
            row = {**stats(r["gbps"]), "seconds": stats(r["secs"], 3), "runs": [round(x, 2) for x in r["gbps"]],
                   "verified": r["ok"]}
        for key in ("error", "skipped"):
            if r[key]:
                row[key] = r[key]
        res["rows"][name] = row
        print(name, row, flush=True)

    def med(name):
        return res["rows"].get(name, {}).get("median")

    targets = [
        ("(a) gdpath / plain transformers", "(a) transformers from_pretrained + gdpath install()",
         "(a) transformers from_pretrained", 3.0),
        ("(b) gdpath loop / gdpath load_file", "(b) gdpath safe_open loop", "(c) gdpath load_file", 0.85),
        ("(b) gdpath loop / InstantTensor loop", "(b) gdpath safe_open loop", "(b) instanttensor safe_open loop", 1.1),
        ("(c) load_file / InstantTensor loop", "(c) gdpath load_file", "(b) instanttensor safe_open loop", 1.1),
        ("(c) load_file / pinned H2D", "(c) gdpath load_file", "(c) pinned H2D copy", 0.9),
    ]
    res["targets"] = {}
    for label, num, den, want in targets:
        x, y = med(num), med(den)
        ratio = round(x / y, 3) if x and y else None
        res["targets"][label] = {"ratio": ratio, "target": want,
                                 "met": None if ratio is None else ratio >= want}
    res["all_verified"] = all(r.get("verified", True) for r in res["rows"].values())
    text = json.dumps(res, indent=1)
    print(json.dumps(res["targets"], indent=1))
    out = a.out or (os.path.join(os.environ["OUT"], "safetensors_dropin.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return 0 if res["all_verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
