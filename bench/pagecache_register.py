"""Experiment behind gdpath's staged file -> GPU path: DMA straight from the page cache instead.

Usage (GPU machine, CuPy): python3 pagecache_register.py tmpfs=/dev/shm/F ext4=/var/tmp/F
(each file is written with a known pattern, read once into the page cache, and removed after;
SIZE=bytes in the environment, 4 GiB by default). Results: docs/benchmarks.md, "Measurements
behind the defaults".

mmap a file that is in the page cache (tmpfs, ext4 hot), page-lock ranges of the mapping with
cuMemHostRegister (READ_ONLY), copy them to the GPU with the copy engine, unregister. Measures
registration cost per GiB, whether file-backed pages are accepted at all, and a pipelined
register -> copy -> unregister over T threads against a pinned-buffer H2D of the same size.
Every GPU result is compared with the file's pattern.
"""
import ctypes, mmap, os, sys, threading, time
import numpy as np
import cupy

cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError(f"{what}: {r} {s.value}")
cupy.cuda.runtime.setDevice(0); cupy.zeros(1)
ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain")
def bind():
    ck(cu.cuCtxSetCurrent(ctx), "setcurrent")

RO = 0x08
SIZE = int(os.environ.get("SIZE", 4 << 30))

def make(path):
    if os.path.exists(path) and os.path.getsize(path) == SIZE:
        return
    step = 256 << 20
    with open(path, "wb") as f:
        for off in range(0, SIZE, step):
            a = np.arange(off // 8, (off + step) // 8, dtype=np.uint64) ^ np.uint64(0x9E3779B97F4A7C15)
            f.write(a.tobytes())
    # read once so the file is in the page cache
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass

def verify(dptr):
    mem = cupy.cuda.UnownedMemory(dptr, SIZE, None)
    a = cupy.ndarray(SIZE // 8, cupy.uint64, cupy.cuda.MemoryPointer(mem, 0))
    exp = cupy.arange(SIZE // 8, dtype=cupy.uint64) ^ cupy.uint64(0x9E3779B97F4A7C15)
    ok = bool((a == exp).all())
    a.fill(0)
    return ok

dptr = ctypes.c_uint64(); ck(cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(SIZE)), "alloc")
dptr = dptr.value

def pinned_h2d():
    h = cupy.cuda.alloc_pinned_memory(SIZE)
    hp = h.ptr
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        ck(cu.cuMemcpyHtoD_v2(ctypes.c_uint64(dptr), ctypes.c_void_p(hp), ctypes.c_size_t(SIZE)), "h2d")
        ts.append(SIZE / (time.perf_counter() - t) / 1e9)
    del h
    return sorted(ts)

def run(path, label):
    make(path)
    fd = os.open(path, os.O_RDONLY)
    for populate in (False, True):
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0x8000) if populate else 0)
        mm = mmap.mmap(fd, SIZE, flags, mmap.PROT_READ)
        base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
        t = time.perf_counter()
        r = cu.cuMemHostRegister_v2(ctypes.c_void_p(base), ctypes.c_size_t(SIZE), RO)
        treg = time.perf_counter() - t
        if r != 0:
            print(f"{label} populate={populate}: register whole READ_ONLY failed {r}")
            mm.close(); continue
        t = time.perf_counter()
        ck(cu.cuMemcpyHtoD_v2(ctypes.c_uint64(dptr), ctypes.c_void_p(base), ctypes.c_size_t(SIZE)), "h2d")
        tcp = time.perf_counter() - t
        t = time.perf_counter(); ck(cu.cuMemHostUnregister(ctypes.c_void_p(base)), "unreg"); tun = time.perf_counter() - t
        print(f"{label} populate={populate} whole: register {treg*1e3:.1f} ms ({SIZE/treg/1e9:.1f} GB/s), "
              f"copy {SIZE/tcp/1e9:.2f} GB/s, unregister {tun*1e3:.1f} ms, verified={verify(dptr)}", flush=True)
        mm.close()
    # flags 0 on a read-only mapping (expected to fail)
    mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
    base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    r = cu.cuMemHostRegister_v2(ctypes.c_void_p(base), ctypes.c_size_t(1 << 20), 0)
    print(f"{label} flags=0 on PROT_READ: {r}")
    if r == 0: cu.cuMemHostUnregister(ctypes.c_void_p(base))
    mm.close()
    # pipelined
    for chunk_mib in (16, 64, 256):
        for nt in (1, 2, 4, 8, 16):
            chunk = chunk_mib << 20
            res = []
            for rep in range(3):
                mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
                base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
                n = SIZE // chunk
                nxt = [0]; lock = threading.Lock(); err = []
                treg = [0.0] * nt
                def worker(i):
                    bind()
                    s = ctypes.c_void_p(); ck(cu.cuStreamCreate(ctypes.byref(s), 1), "stream")
                    try:
                        while True:
                            with lock:
                                k = nxt[0]; nxt[0] += 1
                            if k >= n: break
                            p = base + k * chunk
                            t0 = time.perf_counter()
                            ck(cu.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(chunk), RO), "reg")
                            treg[i] += time.perf_counter() - t0
                            ck(cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dptr + k * chunk), ctypes.c_void_p(p), ctypes.c_size_t(chunk), s), "cp")
                            ck(cu.cuStreamSynchronize(s), "sync")
                            ck(cu.cuMemHostUnregister(ctypes.c_void_p(p)), "unreg")
                    except Exception as e:
                        err.append(e)
                ths = [threading.Thread(target=worker, args=(i,)) for i in range(nt)]
                t = time.perf_counter()
                for th in ths: th.start()
                for th in ths: th.join()
                el = time.perf_counter() - t
                mm.close()
                if err:
                    print(f"{label} chunk {chunk_mib} MiB x {nt}: {err[0]}"); break
                res.append((SIZE / el / 1e9, sum(treg) / nt))
            if res:
                ok = verify(dptr)
                g = sorted(r[0] for r in res)
                print(f"{label} pipelined chunk {chunk_mib:3d} MiB x {nt:2d} threads: {g[0]:.2f} / {g[len(g)//2]:.2f} / {g[-1]:.2f} GB/s, "
                      f"register per thread {res[-1][1]*1e3:.0f} ms, verified={ok}", flush=True)
    os.close(fd)

print("pinned H2D 4 GiB:", ["%.2f" % x for x in pinned_h2d()], flush=True)
for path, label in [(a.split("=")[1], a.split("=")[0]) for a in sys.argv[1:]]:
    try:
        run(path, label)
    except Exception as e:
        print(label, "failed:", e)
    finally:
        if label != "keep":
            try: os.unlink(path)
            except OSError: pass
print("pinned H2D 4 GiB:", ["%.2f" % x for x in pinned_h2d()], flush=True)
