//! Device-side verification: fill with the test pattern, check against it, compare two
//! buffers, without copying the data back to the host.
//!
//! The kernels are hand-written PTX (`src/ptx/verify.ptx`, see [`crate::module`]). If loading
//! fails (a driver without a PTX JIT, e.g. some embedded builds), the `*_on_host` methods do the
//! same work by copying back in chunks and checking on the CPU.

use crate::error::CudaError;
use crate::memory::{check_range, DeviceBuffer, PinnedHostBuffer};
use crate::module::{self, Kernel};
use crate::pattern::{self, Verdict};
use crate::stream::Stream;

/// Threads per block of every kernel.
const BLOCK: u32 = 256;

/// Blocks per SM at most: enough to fill every SM several times over.
const BLOCKS_PER_SM: u32 = 8;

/// SMs assumed when the device does not say.
const DEFAULT_SMS: u32 = 16;

impl Stream {
    /// Launch `kernel` over `len` bytes with its 64-bit `params`, on the stream's GPU.
    fn launch_pattern(&self, kernel: Kernel, len: usize, params: &[u64]) -> Result<(), CudaError> {
        let ctx = self.context();
        let f = ctx.kernel(kernel)?;
        let grid_max = ctx.multiprocessors().unwrap_or(DEFAULT_SMS) * BLOCKS_PER_SM;
        let grid = len.div_ceil(BLOCK as usize).min(grid_max as usize).max(1) as u32;
        ctx.bind()?;
        // SAFETY: `params` are the kernel's parameters in order; the ranges they name were
        // checked by the caller, which holds their buffers on this stream.
        unsafe { module::launch(ctx.api(), f, (grid, BLOCK), self.raw(), params) }
    }

    fn same_device(&self, buf: &DeviceBuffer, what: &str) -> Result<(), CudaError> {
        if buf.ordinal() != self.context().ordinal() {
            return Err(CudaError::InvalidArgument(format!(
                "{what} on GPU {} but the stream is on GPU {}",
                buf.ordinal(),
                self.context().ordinal()
            )));
        }
        Ok(())
    }

    /// Checks that `buf[off .. off + len]` is inside `buf` and that `buf` is on the stream's
    /// GPU (`what` names the range in errors); whether there is anything to do (`len > 0`).
    fn pattern_range(
        &self,
        what: &str,
        buf: &DeviceBuffer,
        off: usize,
        len: usize,
    ) -> Result<bool, CudaError> {
        check_range(what, buf.len(), off, len)?;
        self.same_device(buf, &format!("{what} buffer"))?;
        Ok(len > 0)
    }

    /// Fill `buf[off .. off + len]` with the test pattern for stream positions
    /// `pos .. pos + len` ([`crate::pattern`]), on the GPU, asynchronously.
    pub fn fill_pattern(
        &self,
        buf: &DeviceBuffer,
        off: usize,
        len: usize,
        seed: u64,
        pos: u64,
    ) -> Result<(), CudaError> {
        if !self.pattern_range("pattern fill", buf, off, len)? {
            return Ok(());
        }
        self.launch_pattern(
            Kernel::FillPattern,
            len,
            &[buf.at(off), len as u64, pos, seed],
        )?;
        self.hold_device(&[buf]);
        Ok(())
    }

    /// Run a checking `kernel` over `len` bytes of `bufs` with `params` and a 16-byte result
    /// buffer (mismatch count, first mismatch) as its last parameter, and read the verdict back.
    /// Blocking.
    fn run_check(
        &self,
        kernel: Kernel,
        len: usize,
        params: &[u64],
        bufs: &[&DeviceBuffer],
    ) -> Result<Verdict, CudaError> {
        self.context().kernel(kernel)?;
        let out = DeviceBuffer::new(self.context(), 16)?;
        let mut init = [0xffu8; 16];
        init[..8].fill(0);
        self.write_from_slice(&out, 0, &init)?;
        let mut all = params.to_vec();
        all.push(out.device_ptr());
        self.launch_pattern(kernel, len, &all)?;
        self.hold_device(bufs);
        self.hold_device(&[&out]);
        let mut res = [0u8; 16];
        self.read_into_slice(&mut res, &out, 0)?;
        let count = u64::from_le_bytes(res[..8].try_into().expect("8 bytes"));
        let first = u64::from_le_bytes(res[8..].try_into().expect("8 bytes"));
        Ok(Verdict {
            mismatches: count,
            first_mismatch: (count > 0).then_some(first),
        })
    }

    /// Check `buf[off .. off + len]` against the pattern for positions `pos .. pos + len`, on
    /// the GPU. Blocking: synchronizes the stream (so it also waits for earlier work on it).
    pub fn verify_pattern(
        &self,
        buf: &DeviceBuffer,
        off: usize,
        len: usize,
        seed: u64,
        pos: u64,
    ) -> Result<Verdict, CudaError> {
        if !self.pattern_range("pattern check", buf, off, len)? {
            return Ok(Verdict::default());
        }
        let params = [buf.at(off), len as u64, pos, seed];
        self.run_check(Kernel::CheckPattern, len, &params, &[buf])
    }

    /// Compare `a[a_off ..]` with `b[b_off ..]` over `len` bytes on the GPU. Both buffers must
    /// be on the stream's GPU. Blocking.
    pub fn compare(
        &self,
        a: &DeviceBuffer,
        a_off: usize,
        b: &DeviceBuffer,
        b_off: usize,
        len: usize,
    ) -> Result<Verdict, CudaError> {
        check_range("compare a", a.len(), a_off, len)?;
        check_range("compare b", b.len(), b_off, len)?;
        self.same_device(a, "compare buffer a")?;
        self.same_device(b, "compare buffer b")?;
        if len == 0 {
            return Ok(Verdict::default());
        }
        let params = [a.at(a_off), b.at(b_off), len as u64];
        self.run_check(Kernel::Compare, len, &params, &[a, b])
    }

    /// [`Stream::verify_pattern`] without kernels: copy back through `staging` (pinned, any
    /// size) chunk by chunk and check on the CPU. Blocking.
    pub fn verify_pattern_on_host(
        &self,
        buf: &DeviceBuffer,
        off: usize,
        len: usize,
        seed: u64,
        pos: u64,
        staging: &mut PinnedHostBuffer,
    ) -> Result<Verdict, CudaError> {
        check_range("pattern check", buf.len(), off, len)?;
        let mut v = Verdict::default();
        let mut done = 0usize;
        while done < len {
            let n = staging.len().min(len - done);
            self.copy_d2h(staging, 0, buf, off + done, n)?;
            self.synchronize()?;
            let local = pattern::check(&staging.as_slice()?[..n], seed, pos + done as u64);
            v.merge(local, done as u64);
            done += n;
        }
        Ok(v)
    }
}
