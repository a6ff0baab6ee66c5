//! SIGINT, SIGTERM and SIGHUP (the `ctrlc` crate, feature `termination`, which handles them on
//! a thread of its own, not in the signal handler). One handler per process, in one of two
//! modes:
//!
//! - [`flag`] (`serve`, `bench net`): the first signal sets a flag they poll, so that they end
//!   by saying goodbye to their peers instead of leaving them a connection that fails some time
//!   later (a client killed mid-stream can also trip UCX 1.13's put-handler abort in its
//!   server: docs/network.md); a second signal ends the process at once.
//! - [`clean_up_on_interrupt`] (every other command): the first signal ends the process at
//!   once.
//!
//! Either way the process ends with status 130, after removing the temporary files of writes in
//! progress (`gdpath::file::remove_live_temporaries`): an interrupted `copy`, `topo capture` or
//! `bench storage` leaves the old file as it was and no partial one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Exit status of an interrupted command (128 + SIGINT, as shells report it).
pub const INTERRUPTED_STATUS: i32 = 130;

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Removes the temporaries of writes in progress and ends the process at once: not through
/// exit(3), whose handlers (UCX's among them) would run while the main thread may be inside
/// UCX.
fn end_now() -> ! {
    let removed = gdpath::file::remove_live_temporaries();
    if removed > 0 {
        errln!("gdpath: interrupted; removed {removed} unfinished temporary file(s)");
    } else {
        errln!("gdpath: interrupted");
    }
    gdpath::os::exit_immediately(INTERRUPTED_STATUS)
}

/// Installs the process's handler (once); `graceful` chooses its mode.
fn install(graceful: bool) -> Arc<AtomicBool> {
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        let seen = flag.clone();
        let installed = ctrlc::set_handler(move || {
            if !graceful || seen.swap(true, Ordering::SeqCst) {
                end_now();
            }
            errln!("gdpath: stopping (a second signal stops at once)");
        });
        if let Err(e) = installed {
            tracing::debug!("no handler for SIGINT/SIGTERM: {e}");
        }
        flag
    })
    .clone()
}

/// The stop flag, set by the first SIGINT, SIGTERM or SIGHUP; the graceful handler is installed
/// on first use. Where it cannot be installed (another handler is), the flag never sets and the
/// signals keep their default action.
pub fn flag() -> Arc<AtomicBool> {
    install(true)
}

/// Installs the handler that ends the process at the first signal, removing the temporary
/// files of writes in progress first.
pub fn clean_up_on_interrupt() {
    install(false);
}
