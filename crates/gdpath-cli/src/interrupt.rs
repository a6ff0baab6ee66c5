//! SIGINT, SIGTERM and SIGHUP as a request to stop (the `ctrlc` crate, feature
//! `termination`): the first sets a flag that `serve` and `bench net` poll, so that they end by
//! saying goodbye to their peers instead of leaving them a connection that fails some time
//! later (a client killed mid-stream can also trip UCX 1.13's put-handler abort in its server:
//! docs/network.md); a second signal ends the process at once, status 130.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// The stop flag, set by the first SIGINT, SIGTERM or SIGHUP; the handler is installed on
/// first use.
/// Where it cannot be installed (another handler is), the flag never sets and the signals
/// keep their default action.
pub fn flag() -> Arc<AtomicBool> {
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        let seen = flag.clone();
        // ctrlc runs this on a thread of its own, not in the signal handler.
        let installed = ctrlc::set_handler(move || {
            if seen.swap(true, Ordering::SeqCst) {
                // At once: not through exit(3), whose handlers (UCX's among them) would run
                // while the main thread may be inside UCX.
                gdpath::os::exit_immediately(130);
            }
            eprintln!("gdpath: stopping (a second signal stops at once)");
        });
        if let Err(e) = installed {
            tracing::debug!("no handler for SIGINT/SIGTERM: {e}");
        }
        flag
    })
    .clone()
}
