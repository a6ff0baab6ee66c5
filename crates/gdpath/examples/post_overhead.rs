//! The engine's own cost per descriptor pair: host → host transfers of 8-byte pairs, posted and
//! waited for one at a time, so that the copy is nothing and planning, region use, work items
//! and completion are everything. Reports ns per pair (min / median / max of 5 runs) for
//! transfers of 1 and of 16 pairs, and checks every byte at the end.
//!
//! Usage: `cargo run --release -p gdpath --example post_overhead [PAIRS_PER_RUN]`
//! (default 400 000, at least 16 384). Pin it (`taskset -c 1`) and compare builds in alternation: the figure
//! moves with the machine's load.

use gdpath::{Agent, AgentConfig, HostBuffer, Memory, TransferRequest};
use std::time::Instant;

const PAIR: u64 = 8;
const SLOTS: u64 = 1024;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // At least every slot written by transfers of 16 pairs, so that the check covers them all.
    let pairs: u64 = std::env::args()
        .nth(1)
        .map_or(Ok(400_000), |a| a.parse::<u64>())?
        .max(16 * SLOTS);
    let agent = Agent::new(AgentConfig::default())?;
    let mut pattern = vec![0u8; (SLOTS * PAIR) as usize];
    for (i, b) in pattern.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    let src = agent.register(Memory::host(HostBuffer::from_slice(&pattern)))?;
    for batch in [1u64, 16] {
        let dst = agent.register(Memory::host(HostBuffer::zeroed((SLOTS * PAIR) as usize)))?;
        let transfers = pairs / batch;
        let mut ns = Vec::new();
        for _ in 0..5 {
            let t0 = Instant::now();
            for t in 0..transfers {
                let (mut l, mut r) = (Vec::new(), Vec::new());
                for k in 0..batch {
                    let off = ((t * batch + k) % SLOTS) * PAIR;
                    l.push(src.desc(off, PAIR));
                    r.push(dst.desc(off, PAIR));
                }
                agent.post(TransferRequest::write(l, r))?.wait()?;
            }
            ns.push(t0.elapsed().as_nanos() as f64 / (transfers * batch) as f64);
        }
        let ok = *dst.host_view()? == pattern[..];
        ns.sort_by(f64::total_cmp);
        println!(
            "{batch:>2} pair(s) per transfer: {:.0} / {:.0} / {:.0} ns per pair (min / median / max of 5), verified: {}",
            ns[0],
            ns[2],
            ns[4],
            if ok { "yes" } else { "NO" }
        );
        if !ok {
            return Err("destination bytes differ from the source".into());
        }
    }
    Ok(())
}
