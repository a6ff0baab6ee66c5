// gdpath block-list copy kernel: one launch copies a whole list of (dst, src, len) descriptors.
//
// Built to PTX by scripts/gen-kv-ptx.sh with clang's NVPTX backend (no CUDA toolkit needed);
// the PTX is committed beside this file and loaded at run time with cuModuleLoadData, which
// JIT-compiles it for the device. See crates/gdpath-cuda/src/blocks/kernel.rs for the launch.
//
// Work split: one warp per descriptor, descriptors taken in grid-stride order (warp w copies
// descriptors w, w + W, w + 2W, ... where W is the number of warps in the grid). The host splits
// descriptors longer than a piece size first, so no warp gets far more bytes than the others.
// Each lane moves 4 elements per step before storing any (4 x 16 B = 64 B in flight per lane,
// 2 KiB per warp, 128 KiB per SM at full occupancy): enough loads in flight to cover HBM and
// PCIe latency, with every warp-wide access a contiguous 512 B (four full 128 B lines), which
// is also what PCIe write combining wants for a pinned host destination.
//
// Widths: the widest of 16/8/4/2/1 bytes that divides (dst - src); a byte-wise head brings dst
// (and so src) to that alignment, a byte-wise tail finishes the length. So 16-byte aligned
// descriptors run with 16-byte loads and stores only, and any offset or length is correct.

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define INLINE __attribute__((always_inline)) inline

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// 16 bytes as one vector, so loads and stores become ld/st.global.v4.u32.
typedef u32 v4u32 __attribute__((ext_vector_type(4)));

// Pointers into the global state space (device memory, and pinned host memory and peer memory
// mapped into it), so the backend emits ld.global / st.global rather than generic accesses.
#define GLOBAL __attribute__((address_space(1)))

// One descriptor, as crate::blocks::BlockCopy lays it out (repr(C), 24 bytes).
struct Desc {
    u64 dst;
    u64 src;
    u64 len;
};

static const u32 WARP = 32;
static const u32 UNROLL = 4;

template <typename T>
static __device__ INLINE void copy_body(GLOBAL u8 *dst, const GLOBAL u8 *src, u64 n, u32 lane) {
    GLOBAL T *d = (GLOBAL T *)dst;
    const GLOBAL T *s = (const GLOBAL T *)src;
    u64 base = 0;
    for (; base + UNROLL * WARP <= n; base += UNROLL * WARP) {
        T v[UNROLL];
#pragma unroll
        for (u32 k = 0; k < UNROLL; k++)
            v[k] = s[base + k * WARP + lane];
#pragma unroll
        for (u32 k = 0; k < UNROLL; k++)
            d[base + k * WARP + lane] = v[k];
    }
    for (u64 i = base + lane; i < n; i += WARP)
        d[i] = s[i];
}

static __device__ INLINE void copy_bytes(GLOBAL u8 *dst, const GLOBAL u8 *src, u64 n, u32 lane) {
    for (u64 i = lane; i < n; i += WARP)
        dst[i] = src[i];
}

static __device__ INLINE void copy_one(u64 dst, u64 src, u64 len, u32 lane) {
    u64 diff = dst - src;
    u32 w = (diff & 15) == 0 ? 16 : (diff & 7) == 0 ? 8 : (diff & 3) == 0 ? 4 : (diff & 1) == 0 ? 2 : 1;
    // Generic to global through cvta.to.global, as PTX defines it (the same value on every GPU
    // so far, but only the conversion is specified).
    GLOBAL u8 *d = (GLOBAL u8 *)(u8 *)dst;
    const GLOBAL u8 *s = (const GLOBAL u8 *)(const u8 *)src;
    if (w == 1) {
        copy_bytes(d, s, len, lane);
        return;
    }
    u64 head = (w - (dst & (w - 1))) & (w - 1);
    if (head > len)
        head = len;
    u64 body = (len - head) & ~(u64)(w - 1);
    u64 tail = len - head - body;
    copy_bytes(d, s, head, lane);
    d += head;
    s += head;
    switch (w) {
    case 16: copy_body<v4u32>(d, s, body / 16, lane); break;
    case 8: copy_body<u64>(d, s, body / 8, lane); break;
    case 4: copy_body<u32>(d, s, body / 4, lane); break;
    default: copy_body<u16>(d, s, body / 2, lane); break;
    }
    copy_bytes(d + body, s + body, tail, lane);
}

static __device__ INLINE Desc load_desc(const GLOBAL Desc *p) {
    Desc d;
    d.dst = p->dst;
    d.src = p->src;
    d.len = p->len;
    return d;
}

// descs: n descriptors in device memory. Any grid and block size whose block size is a
// multiple of 32; every warp finds its own descriptors.
extern "C" __global__ void gdpath_copy_blocks(const Desc *__restrict__ list, u64 n) {
    const GLOBAL Desc *descs = (const GLOBAL Desc *)list;
    u32 tid = __nvvm_read_ptx_sreg_tid_x();
    u32 lane = tid & (WARP - 1);
    u64 warp = ((u64)__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() + tid) / WARP;
    u64 warps = ((u64)__nvvm_read_ptx_sreg_nctaid_x() * __nvvm_read_ptx_sreg_ntid_x()) / WARP;
    if (warp >= n)
        return;
    Desc cur = load_desc(descs + warp);
    for (u64 i = warp;;) {
        u64 next = i + warps;
        // Load the next descriptor before copying this one, so its latency overlaps the copy.
        Desc nx = {0, 0, 0};
        if (next < n)
            nx = load_desc(descs + next);
        copy_one(cur.dst, cur.src, cur.len, lane);
        if (next >= n)
            break;
        cur = nx;
        i = next;
    }
}
