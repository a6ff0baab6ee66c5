//! Loading libucp at run time and checking its version.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::call;
use crate::error::{Result, Status, UcxError};
use crate::sync::lock;
use crate::sys;

/// The library `Ucx::load` opens unless [`ENV_LIB`] names another.
pub const LIBUCP_SONAME: &str = "libucp.so.0";
/// Environment variable naming the libucp to load (a path such as the `libucx-cu13` wheel's
/// `site-packages/libucx/lib/libucp.so.0`, or a soname).
pub const ENV_LIB: &str = "GDPATH_UCX_LIB";
/// The oldest UCX whose ABI these bindings follow (the headers `src/sys.rs` was made from).
pub const MIN_VERSION: UcxVersion = UcxVersion {
    major: 1,
    minor: 13,
    release: 0,
};
/// First UCX release with `UCP_EP_ATTR_FIELD_TRANSPORTS` in `ucp_ep_query`.
const EP_QUERY_TRANSPORTS_SINCE: UcxVersion = UcxVersion {
    major: 1,
    minor: 14,
    release: 0,
};

/// A UCX release number as `ucp_get_version` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UcxVersion {
    /// Major (1 for every UCX so far).
    pub major: u32,
    /// Minor (13 for Debian bookworm, 16 for Ubuntu 24.04; see `docs/ucx.md` for others).
    pub minor: u32,
    /// Release (patch) number.
    pub release: u32,
}

impl fmt::Display for UcxVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.release)
    }
}

/// An opened libucp with its version. Kept for the life of the process (never unloaded:
/// UCX registers global state, such as memory hooks, that must not disappear).
pub struct Ucx {
    pub(crate) api: sys::Ucp,
    library: String,
    version: UcxVersion,
    version_string: String,
}

impl fmt::Debug for Ucx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ucx")
            .field("library", &self.library)
            .field("version", &self.version)
            .finish()
    }
}

/// The one libucp of this process, once loaded.
static LOADED: Mutex<Option<Arc<Ucx>>> = Mutex::new(None);

impl Ucx {
    /// Loads the process's libucp: the library named by `GDPATH_UCX_LIB` if set, else
    /// `libucp.so.0` from the loader's search path. Returns the same `Arc` on every call.
    ///
    /// Errors: [`UcxError::LibraryMissing`] (names the library and the packages providing it),
    /// [`UcxError::SymbolMissing`], [`UcxError::VersionTooOld`].
    pub fn load() -> Result<Arc<Ucx>> {
        let lib = std::env::var(ENV_LIB)
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| LIBUCP_SONAME.to_string());
        Self::load_from(lib)
    }

    /// Loads libucp from `library` (a path, or a soname searched by the dynamic loader).
    ///
    /// One UCX build per process: when a library is already loaded, the same name returns it
    /// and a different one fails with [`UcxError::AlreadyLoaded`] (two builds' `libucs`
    /// symbols would clash), except that a path that does not exist fails with
    /// [`UcxError::LibraryMissing`] first.
    pub fn load_from(library: impl AsRef<str>) -> Result<Arc<Ucx>> {
        let library = library.as_ref().to_string();
        let mut slot = lock(&LOADED);
        if let Some(loaded) = slot.as_ref() {
            if loaded.library == library {
                return Ok(loaded.clone());
            }
            if library.contains('/') && !Path::new(&library).exists() {
                return Err(UcxError::LibraryMissing {
                    library,
                    reason: "no such file".into(),
                });
            }
            return Err(UcxError::AlreadyLoaded {
                loaded: loaded.library.clone(),
                requested: library,
            });
        }
        let ucx = Arc::new(Self::open(&library)?);
        tracing::debug!(library = %ucx.library, version = %ucx.version, "loaded libucp");
        *slot = Some(ucx.clone());
        Ok(ucx)
    }

    fn open(library: &str) -> Result<Ucx> {
        route_log();
        // SAFETY: opening libucp runs its constructors, which only initialise UCX's own
        // globals; the symbols are typed by bindgen from UCX's headers.
        let api = unsafe { sys::Ucp::new(library) }.map_err(|e| UcxError::LibraryMissing {
            library: library.to_string(),
            reason: loader_message(&e),
        })?;
        call::check_symbols(&api, library)?;
        let (major, minor, release) = call::get_version(&api);
        let version = UcxVersion {
            major,
            minor,
            release,
        };
        if major != MIN_VERSION.major || minor < MIN_VERSION.minor {
            return Err(UcxError::VersionTooOld {
                library: library.to_string(),
                found: version.to_string(),
            });
        }
        let version_string = call::get_version_string(&api);
        Ok(Ucx {
            api,
            library: library.to_string(),
            version,
            version_string,
        })
    }

    /// The name or path the library was loaded from.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The version of the loaded library (`ucp_get_version`).
    pub fn version(&self) -> UcxVersion {
        self.version
    }

    /// The version string of the loaded library (`ucp_get_version_string`, e.g. `1.13.1`).
    pub fn version_string(&self) -> &str {
        &self.version_string
    }

    /// True when `ucp_ep_query` can report an endpoint's transports (UCX >= 1.14).
    pub fn has_ep_transport_query(&self) -> bool {
        self.version >= EP_QUERY_TRANSPORTS_SINCE
    }

    /// UCX's own description of a status (`ucs_status_string`).
    pub fn status_string(&self, status: Status) -> String {
        call::status_string(&self.api, status)
    }
}

/// Where UCX writes its log (`UCX_LOG_FILE`): stdout unless told otherwise, which would mix its
/// warnings (such as "unused env variable") into a program's own output, `--json` documents
/// and tables alike. Unless the user chose a destination, it goes to stderr: set before libucp
/// is loaded, since UCX reads the variable when the library initialises. The variable is
/// then visible to the whole process (and the programs it starts).
pub const LOG_FILE_ENV: &str = "UCX_LOG_FILE";

fn route_log() {
    if std::env::var_os(LOG_FILE_ENV).is_none() {
        std::env::set_var(LOG_FILE_ENV, "stderr");
    }
}

/// The loader's whole message: libloading's error says "dlopen failed" and keeps `dlerror`'s
/// text (which names the real problem: no such file, invalid ELF header, ...) as its source.
fn loader_message(e: &libloading::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let t = c.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = c.source();
    }
    text
}
