//! Fan-out of one copy over several CPU threads, shared by the backends that split a transfer
//! between worker threads (cuFile, file ↔ GPU staging, pageable host staging).

/// Runs `one(w)` for every `w` in `0..workers` on scoped threads (on the calling thread when
/// `workers` ≤ 1), joins every thread before returning, so that none still touches the memory
/// the workers borrow, and returns the first error in worker order. A worker that panics counts
/// as the error `panicked()`.
pub(crate) fn fan_out<E, F, P>(workers: usize, one: F, panicked: P) -> Result<(), E>
where
    F: Fn(usize) -> Result<(), E> + Sync,
    P: Fn() -> E,
    E: Send,
{
    if workers <= 1 {
        return one(0);
    }
    std::thread::scope(|s| {
        let one = &one;
        let handles: Vec<_> = (0..workers).map(|w| s.spawn(move || one(w))).collect();
        let results: Vec<Result<(), E>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(panicked())))
            .collect();
        results.into_iter().collect()
    })
}

#[cfg(test)]
mod tests {
    use super::fan_out;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn runs_every_worker_and_reports_the_first_error_in_worker_order() {
        let ran = AtomicUsize::new(0);
        let r = fan_out(
            4,
            |w| {
                ran.fetch_add(1, Ordering::SeqCst);
                if w >= 2 {
                    Err(w)
                } else {
                    Ok(())
                }
            },
            || usize::MAX,
        );
        assert_eq!(r, Err(2));
        assert_eq!(
            ran.load(Ordering::SeqCst),
            4,
            "every worker ran and was joined"
        );
        assert_eq!(
            fan_out(1, |w| if w == 0 { Ok(()) } else { Err(w) }, || 9),
            Ok(())
        );
    }

    #[test]
    fn a_panicking_worker_is_an_error() {
        let r = fan_out(
            3,
            |w| {
                if w == 1 {
                    panic!("worker 1 fails");
                }
                Ok::<(), &str>(())
            },
            || "panicked",
        );
        assert_eq!(r, Err("panicked"));
    }
}
