//! Finding and opening the vendor libraries at run time.
//!
//! Order for every library: the explicit path in the library's environment variable
//! (`GDPATH_LIBCUDA`, `GDPATH_LIBNVML`, `GDPATH_LIBCUFILE`), then bare names handed to `dlopen`
//! (which searches `LD_LIBRARY_PATH`, the `ld.so` cache and the default directories), then
//! absolute paths in the places vendors install outside the loader's search path. For cuFile
//! those are the CUDA toolkit directories and the `nvidia-cufile` Python wheels, whose library is
//! `libcufile.so.0` (CUDA 12/13 toolkits ship `libcufile.so.0` as the SONAME, with `.so` only as
//! a development link).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{CudaError, Library};

/// Where to look, separated from the process so that tests can point it at a fake tree.
#[derive(Debug, Clone, Default)]
pub struct SearchEnv {
    /// The library's override variable (`GDPATH_LIB*`), if set.
    pub override_path: Option<PathBuf>,
    /// Filesystem root the absolute directories are taken relative to (`/` for the live system).
    pub root: PathBuf,
    /// `CUDA_HOME` / `CUDA_PATH`, if set.
    pub cuda_home: Vec<PathBuf>,
    /// `VIRTUAL_ENV`, `CONDA_PREFIX` and `$HOME/.local`, if set: roots of Python environments.
    pub python_prefixes: Vec<PathBuf>,
}

impl SearchEnv {
    /// The environment of this process, for `library`.
    pub fn from_process(library: Library) -> SearchEnv {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let mut python_prefixes = Vec::new();
        for k in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
            if let Some(v) = var(k) {
                python_prefixes.push(PathBuf::from(v));
            }
        }
        if let Some(home) = var("HOME") {
            python_prefixes.push(PathBuf::from(home).join(".local"));
        }
        SearchEnv {
            override_path: var(library.env_override()).map(PathBuf::from),
            root: PathBuf::from("/"),
            cuda_home: ["CUDA_HOME", "CUDA_PATH"]
                .iter()
                .filter_map(|k| var(k).map(PathBuf::from))
                .collect(),
            python_prefixes,
        }
    }
}

/// One thing to hand to `dlopen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidate {
    /// A bare file name: the dynamic loader searches for it.
    Name(&'static str),
    /// An absolute path that exists.
    Path(PathBuf),
}

impl Candidate {
    fn as_os(&self) -> OsString {
        match self {
            Candidate::Name(n) => OsString::from(n),
            Candidate::Path(p) => p.clone().into_os_string(),
        }
    }

    /// As text, for error messages.
    pub fn display(&self) -> String {
        match self {
            Candidate::Name(n) => (*n).to_string(),
            Candidate::Path(p) => p.display().to_string(),
        }
    }
}

/// File names to try for `library`, most specific (the versioned SONAME) first.
pub fn file_names(library: Library) -> &'static [&'static str] {
    match library {
        Library::CudaDriver => &["libcuda.so.1", "libcuda.so"],
        Library::Nvml => &["libnvidia-ml.so.1", "libnvidia-ml.so"],
        Library::CuFile => &["libcufile.so.0", "libcufile.so.1", "libcufile.so"],
    }
}

const ARCH_DIR: &str = if cfg!(target_arch = "aarch64") {
    "sbsa-linux"
} else {
    "x86_64-linux"
};

/// Directories outside the loader's default search where `library` is commonly installed.
fn extra_dirs(library: Library, env: &SearchEnv) -> Vec<PathBuf> {
    let under_root = |p: &str| env.root.join(p.trim_start_matches('/'));
    let mut dirs = Vec::new();
    match library {
        Library::CudaDriver | Library::Nvml => {
            // Containers built on NVIDIA's images mount the driver here; WSL puts it in lib/wsl.
            dirs.push(under_root("/usr/local/nvidia/lib64"));
            dirs.push(under_root("/usr/lib/wsl/lib"));
            dirs.push(under_root("/usr/lib64"));
        }
        Library::CuFile => {
            for home in &env.cuda_home {
                dirs.push(home.join("lib64"));
                dirs.push(home.join("targets").join(ARCH_DIR).join("lib"));
            }
            dirs.push(under_root("/usr/local/cuda/lib64"));
            dirs.push(under_root(&format!(
                "/usr/local/cuda/targets/{ARCH_DIR}/lib"
            )));
            // Versioned toolkits, newest first by name (cuda-13.0 before cuda-12.8).
            let mut versioned = list_dir(&under_root("/usr/local"))
                .into_iter()
                .filter(|n| n.starts_with("cuda-"))
                .collect::<Vec<_>>();
            versioned.sort_by_key(|v| std::cmp::Reverse(version_key(v)));
            for v in versioned {
                dirs.push(
                    under_root("/usr/local")
                        .join(&v)
                        .join("targets")
                        .join(ARCH_DIR)
                        .join("lib"),
                );
                dirs.push(under_root("/usr/local").join(&v).join("lib64"));
            }
            for site in python_site_dirs(env) {
                // nvidia-cufile (CUDA 13) and nvidia-cufile-cu12 wheels.
                dirs.push(site.join("nvidia/cu13/lib"));
                dirs.push(site.join("nvidia/cufile/lib"));
            }
        }
    }
    dirs
}

/// `site-packages` / `dist-packages` folders of the Python environments we know of: the
/// process's virtualenv or conda prefix, `~/.local`, `/usr/local`, `/usr`, and `/opt/*/.venv`
/// and `/opt/*/venv` (common for images that ship a framework).
fn python_site_dirs(env: &SearchEnv) -> Vec<PathBuf> {
    let mut prefixes = env.python_prefixes.clone();
    prefixes.push(env.root.join("usr/local"));
    prefixes.push(env.root.join("usr"));
    let opt = env.root.join("opt");
    let mut opt_entries = list_dir(&opt);
    opt_entries.sort();
    for entry in opt_entries {
        for venv in [".venv", "venv"] {
            prefixes.push(opt.join(&entry).join(venv));
        }
    }
    let mut sites = Vec::new();
    for prefix in prefixes {
        let lib = prefix.join("lib");
        let mut pythons = list_dir(&lib)
            .into_iter()
            .filter(|n| n.starts_with("python3"))
            .collect::<Vec<_>>();
        pythons.sort_by_key(|p| std::cmp::Reverse(version_key(p)));
        for py in pythons {
            for kind in ["site-packages", "dist-packages"] {
                sites.push(lib.join(&py).join(kind));
            }
        }
        sites.push(lib.join("python3/dist-packages"));
    }
    sites
}

/// Numeric parts of a name like `cuda-12.8` or `python3.12`, for newest-first sorting.
fn version_key(name: &str) -> Vec<u32> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

fn list_dir(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Every candidate for `library`, in the order they are tried. Absolute paths are listed only if
/// the file exists; bare names always are (the loader decides).
pub fn candidates(library: Library, env: &SearchEnv) -> Vec<Candidate> {
    let mut out = Vec::new();
    if let Some(p) = &env.override_path {
        out.push(Candidate::Path(p.clone()));
    }
    for name in file_names(library) {
        out.push(Candidate::Name(name));
    }
    for dir in extra_dirs(library, env) {
        for name in file_names(library) {
            let p = dir.join(name);
            if p.is_file() && !out.contains(&Candidate::Path(p.clone())) {
                out.push(Candidate::Path(p));
            }
        }
    }
    out
}

/// Open the first candidate that loads. On failure, a [`CudaError::LibraryMissing`] listing
/// every candidate and the last loader error.
pub fn open(
    library: Library,
    env: &SearchEnv,
) -> Result<(libloading::Library, Candidate), CudaError> {
    let cands = candidates(library, env);
    let mut detail = String::from("no candidate");
    for c in &cands {
        // SAFETY: loading a vendor library runs its initialisers; these are the NVIDIA libraries
        // this crate exists to call, loaded exactly as their own tools load them.
        match unsafe { libloading::Library::new(c.as_os()) } {
            Ok(lib) => {
                tracing::debug!(library = %library, from = %c.display(), "loaded");
                return Ok((lib, c.clone()));
            }
            Err(e) => detail = e.to_string(),
        }
    }
    Err(CudaError::LibraryMissing {
        library,
        tried: cands.iter().map(Candidate::display).collect(),
        detail,
    })
}

/// Look up `names` in order (newest ABI first) and return the first found, with the name it
/// was found under.
///
/// Errors: [`CudaError::SymbolMissing`] naming the newest name when the library has none.
///
/// # Safety
/// `F` must be the exact C signature of every name in `names`.
pub(crate) unsafe fn symbol<F: Copy>(
    lib: &libloading::Library,
    library: Library,
    names: &[&'static str],
    needed: &'static str,
) -> Result<Sym<F>, CudaError> {
    for name in names {
        // SAFETY: the caller's contract: `F` is the symbol's signature.
        if let Ok(s) = unsafe { lib.get::<F>(name.as_bytes()) } {
            return Ok(Sym { f: *s, name });
        }
    }
    Err(CudaError::SymbolMissing {
        library,
        symbol: names[0],
        needed,
    })
}

/// One entry point resolved from a loaded library, and the export name it was found under.
#[derive(Clone, Copy)]
pub(crate) struct Sym<F> {
    /// The entry point.
    pub(crate) f: F,
    /// The name the library exports it as: the newest of its candidates the library has.
    pub(crate) name: &'static str,
}

/// Declares the table of a library's entry points, `$name`, with `resolve(lib, loaded_from)`
/// looking each one up by its candidate names in order (newest ABI first). A required entry the
/// library lacks fails the load with [`CudaError::SymbolMissing`] (naming `$needed`); an
/// optional one is `None`. Each entry is a [`Sym`], so every call through it can name the export
/// it actually called. The fields are visible to the declaring module's parent (its call layer)
/// only; the library handle lives as long as the table, so the pointers stay valid.
macro_rules! symbol_table {
    (
        $(#[$meta:meta])*
        struct $name:ident from $library:expr, needs $needed:expr;
        required {
            $( $(#[$fmeta:meta])* $field:ident: $fty:ty = [$($sym:literal),+]; )*
        }
        optional {
            $( $(#[$ofmeta:meta])* $ofield:ident: $ofty:ty = [$($osym:literal),+]; )*
        }
    ) => {
        $(#[$meta])*
        pub(crate) struct $name {
            _lib: libloading::Library,
            /// What was loaded (name or path), for reports.
            pub(crate) loaded_from: String,
            $( $(#[$fmeta])* pub(super) $field: $crate::loader::Sym<$fty>, )*
            $( $(#[$ofmeta])* pub(super) $ofield: Option<$crate::loader::Sym<$ofty>>, )*
        }

        impl $name {
            /// Resolve every entry of the table from `lib`.
            pub(super) fn resolve(
                lib: libloading::Library,
                loaded_from: String,
            ) -> Result<Self, $crate::error::CudaError> {
                $(
                    // SAFETY: the field's type is the C signature of every name listed.
                    let $field = unsafe {
                        $crate::loader::symbol::<$fty>(&lib, $library, &[$($sym),+], $needed)
                    }?;
                )*
                $(
                    // SAFETY: as above.
                    let $ofield = unsafe {
                        $crate::loader::symbol::<$ofty>(&lib, $library, &[$($osym),+], $needed)
                    }
                    .ok();
                )*
                Ok($name { _lib: lib, loaded_from, $($field,)* $($ofield,)* })
            }
        }
    };
}
pub(crate) use symbol_table;

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"not a library").unwrap();
    }

    #[test]
    fn cufile_candidates_find_toolkit_and_wheel_layouts() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // The device machine's layout (see the probe fixture): toolkit 13.0 and a torch venv.
        touch(&r.join("usr/local/cuda-13.0/targets/x86_64-linux/lib/libcufile.so.0"));
        touch(&r.join("usr/local/cuda-12.8/targets/x86_64-linux/lib/libcufile.so.0"));
        touch(
            &r.join("opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcufile.so.0"),
        );
        touch(&r.join("venv/lib/python3.11/site-packages/nvidia/cufile/lib/libcufile.so.1"));
        let env = SearchEnv {
            override_path: Some(PathBuf::from("/explicit/libcufile.so.0")),
            root: r.to_path_buf(),
            cuda_home: vec![],
            python_prefixes: vec![r.join("venv")],
        };
        let c = candidates(Library::CuFile, &env);
        let shown: Vec<String> = c.iter().map(Candidate::display).collect();
        assert_eq!(shown[0], "/explicit/libcufile.so.0");
        assert_eq!(
            &shown[1..4],
            &["libcufile.so.0", "libcufile.so.1", "libcufile.so"]
        );
        let pos = |suffix: &str| {
            shown
                .iter()
                .position(|s| s.ends_with(suffix))
                .unwrap_or_else(|| panic!("{suffix} not in {shown:#?}"))
        };
        let t13 = pos("cuda-13.0/targets/x86_64-linux/lib/libcufile.so.0");
        let t128 = pos("cuda-12.8/targets/x86_64-linux/lib/libcufile.so.0");
        let venv = pos("venv/lib/python3.11/site-packages/nvidia/cufile/lib/libcufile.so.1");
        let opt =
            pos("opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcufile.so.0");
        assert!(t13 < t128, "newest toolkit first: {shown:#?}");
        assert!(
            t128 < venv && venv < opt,
            "toolkits, then own venv, then /opt: {shown:#?}"
        );
        // Only files that exist are listed as paths.
        assert_eq!(shown.len(), 8, "{shown:#?}");
    }

    #[test]
    fn cuda_home_comes_before_usr_local() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        touch(&r.join("home-cuda/lib64/libcufile.so.0"));
        touch(&r.join("usr/local/cuda/lib64/libcufile.so.0"));
        let env = SearchEnv {
            override_path: None,
            root: r.to_path_buf(),
            cuda_home: vec![r.join("home-cuda")],
            python_prefixes: vec![],
        };
        let shown: Vec<String> = candidates(Library::CuFile, &env)
            .iter()
            .map(Candidate::display)
            .collect();
        assert!(
            shown[3].ends_with("home-cuda/lib64/libcufile.so.0"),
            "{shown:#?}"
        );
        assert!(
            shown[4].ends_with("usr/local/cuda/lib64/libcufile.so.0"),
            "{shown:#?}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_library_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("libcufile.so.0");
        touch(&fake);
        let env = SearchEnv {
            override_path: Some(fake.clone()),
            root: dir.path().join("empty-root"),
            ..Default::default()
        };
        match open(Library::CuFile, &env) {
            // A machine with a real libcufile in the loader path loads that one; fine.
            Ok((_, c)) => assert_ne!(c, Candidate::Path(fake)),
            Err(CudaError::LibraryMissing { library, tried, .. }) => {
                assert_eq!(library, Library::CuFile);
                assert_eq!(tried[0], fake.display().to_string());
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    mod libc_table {
        use std::ffi::c_char;

        use crate::error::Library;

        symbol_table! {
            /// Entry points of the C library, standing in for a vendor library's table.
            struct LibcApi from Library::CudaDriver, needs "a test C library";
            required {
                strlen: unsafe extern "C" fn(*const c_char) -> usize = ["gdpath_strlen_v2", "strlen"];
                abs: unsafe extern "C" fn(i32) -> i32 = ["abs"];
            }
            optional {
                absent: unsafe extern "C" fn() = ["gdpath_no_such_function"];
            }
        }

        symbol_table! {
            /// A table whose required entry no library has (never resolved, so never read).
            #[allow(dead_code)]
            struct Missing from Library::CudaDriver, needs "a test C library";
            required {
                absent: unsafe extern "C" fn() = ["gdpath_absent_v2", "gdpath_absent"];
            }
            optional {}
        }

        pub(super) fn libc() -> libloading::Library {
            // SAFETY: the C library is loaded in every process already.
            unsafe { libloading::Library::new("libc.so.6") }.expect("libc.so.6")
        }

        #[test]
        fn a_table_records_the_name_it_resolved() {
            let api = LibcApi::resolve(libc(), "libc.so.6".into()).unwrap();
            // The newer name is absent, so the older one is what a call reaches and what an
            // error must name.
            assert_eq!(api.strlen.name, "strlen");
            assert_eq!(api.abs.name, "abs");
            assert!(api.absent.is_none());
            // SAFETY: a NUL-terminated string.
            assert_eq!(unsafe { (api.strlen.f)(c"four".as_ptr()) }, 4);
            assert_eq!(api.loaded_from, "libc.so.6");
        }

        #[test]
        fn a_missing_required_entry_names_its_newest_export() {
            match Missing::resolve(libc(), "libc.so.6".into()) {
                Err(crate::CudaError::SymbolMissing { symbol, needed, .. }) => {
                    assert_eq!(symbol, "gdpath_absent_v2");
                    assert_eq!(needed, "a test C library");
                }
                Err(e) => panic!("unexpected error {e}"),
                Ok(_) => panic!("resolved a symbol no library has"),
            }
        }
    }

    #[test]
    fn version_key_orders_numerically() {
        assert!(version_key("cuda-12.10") > version_key("cuda-12.9"));
        assert!(version_key("python3.12") > version_key("python3.9"));
    }
}
