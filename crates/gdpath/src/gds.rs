//! GPUDirect Storage facts and the decision between the GDS paths.
//!
//! [`GdsFacts::gather`] reads what decides whether cuFile can do native GDS, from a root
//! directory (`/` live, or a fixture tree): nvidia-fs (`/proc/driver/nvidia-fs/version`, else
//! `nvidia_fs` in `/proc/modules`) and which `cufile.json` is in force (`$CUFILE_ENV_PATH_JSON`,
//! else `/etc/cufile.json`, per the cuFile API reference). Parsing that file is the doctor's job
//! (`doctor::cufile_json`); its settings come in here as [`CufileSettings`], so there is one
//! parser. [`decide`] then says which GDS path cuFile can take, or why none.

use crate::finding::ids;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The environment variable naming the `cufile.json` cuFile reads (cuFile API reference).
pub const CUFILE_ENV: &str = "CUFILE_ENV_PATH_JSON";
/// Where cuFile reads `cufile.json` when the variable is unset.
pub const CUFILE_DEFAULT_JSON: &str = "/etc/cufile.json";

/// Which `cufile.json` is in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CufileJsonSource {
    /// The path cuFile reads (as cuFile sees it, i.e. not prefixed with the fact root).
    pub path: PathBuf,
    /// True when it came from `$CUFILE_ENV_PATH_JSON`.
    pub from_env: bool,
    /// Whether the file exists (under the fact root). Without it cuFile uses built-in defaults.
    pub exists: bool,
}

/// Facts that decide the GDS path, read from files only (no library is loaded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdsFacts {
    /// The text of `/proc/driver/nvidia-fs/version` (first line, trimmed), when present.
    pub nvidia_fs_version: Option<String>,
    /// `nvidia_fs` is listed in `/proc/modules`.
    pub nvidia_fs_module: bool,
    pub cufile_json: CufileJsonSource,
}

impl GdsFacts {
    /// Reads the facts under `root` (`/` for the live machine). `cufile_env` is the value of
    /// `$CUFILE_ENV_PATH_JSON` (pass `std::env::var_os(CUFILE_ENV).as_deref()` live); an empty
    /// value counts as unset. Missing files are facts (absent), not errors.
    pub fn gather(root: &Path, cufile_env: Option<&OsStr>) -> GdsFacts {
        let under = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
        let nvidia_fs_version =
            std::fs::read_to_string(under(Path::new("/proc/driver/nvidia-fs/version")))
                .ok()
                .map(|t| t.lines().next().unwrap_or("").trim().to_owned());
        let nvidia_fs_module = std::fs::read_to_string(under(Path::new("/proc/modules")))
            .map(|t| {
                t.lines()
                    .any(|l| l.split_whitespace().next() == Some("nvidia_fs"))
            })
            .unwrap_or(false);
        let (path, from_env) = match cufile_env.filter(|v| !v.is_empty()) {
            Some(v) => (PathBuf::from(v), true),
            None => (PathBuf::from(CUFILE_DEFAULT_JSON), false),
        };
        let exists = under(&path).is_file();
        GdsFacts {
            nvidia_fs_version,
            nvidia_fs_module,
            cufile_json: CufileJsonSource {
                path,
                from_env,
                exists,
            },
        }
    }

    /// nvidia-fs is loaded (its proc file exists, or the module is listed).
    pub fn nvidia_fs_loaded(&self) -> bool {
        self.nvidia_fs_version.is_some() || self.nvidia_fs_module
    }
}

/// The `cufile.json` settings that change the GDS decision, as the doctor's parser
/// (`crate::cufile_json::CufileConfig`) reads them; `None` = not set (cuFile's default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CufileSettings {
    /// `properties.allow_compat_mode` (cuFile default: true).
    pub allow_compat_mode: Option<bool>,
    /// `properties.use_pci_p2pdma` (cuFile ≥ 1.13: native GDS through the kernel's PCI P2PDMA,
    /// without nvidia-fs).
    pub use_pci_p2pdma: Option<bool>,
}

impl CufileSettings {
    /// The settings a parsed `cufile.json` sets.
    pub fn from_config(c: &crate::cufile_json::CufileConfig) -> Self {
        CufileSettings {
            allow_compat_mode: c.allow_compat_mode,
            use_pci_p2pdma: c.use_pci_p2pdma,
        }
    }
}

impl GdsFacts {
    /// The settings of the `cufile.json` in force (under `root`, `/` live). A missing file gives
    /// cuFile's defaults; an unreadable or malformed one gives them too, with the reason
    /// (cuFile itself then refuses to start, which the doctor reports as `gds.cufile-config`).
    pub fn settings(&self, root: &Path) -> (CufileSettings, Option<String>) {
        if !self.cufile_json.exists {
            return (CufileSettings::default(), None);
        }
        let path = &self.cufile_json.path;
        let file = root.join(path.strip_prefix("/").unwrap_or(path));
        match std::fs::read_to_string(&file) {
            Ok(text) => match crate::cufile_json::CufileConfig::parse(&text) {
                Ok(c) => (CufileSettings::from_config(&c), None),
                Err(e) => (
                    CufileSettings::default(),
                    Some(format!("{}: {e}", path.display())),
                ),
            },
            Err(e) => (
                CufileSettings::default(),
                Some(format!("{}: {e}", path.display())),
            ),
        }
    }
}

/// What the opened cuFile driver reports (`cuFileDriverGetProperties`), when it opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverView {
    /// nvfs version non-zero: the driver talks to nvidia-fs.
    pub nvfs_loaded: bool,
    /// `dcontrolflags` allow compatibility mode.
    pub compat_allowed: bool,
}

/// The GDS mode cuFile will run a file in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GdsMode {
    /// DMA between storage and GPU memory (`Path::GdsNative`).
    Native,
    /// cuFile's POSIX fallback through its own bounce buffers (`Path::GdsCompat`).
    Compat,
}

/// The decision: the mode and, when it is not native, the finding that says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdsDecision {
    pub mode: GdsMode,
    /// `gds.nvidia-fs-missing` (or `storage.odirect-unsupported`) for compat mode.
    pub finding: Option<&'static str>,
    pub detail: String,
}

/// Which GDS mode cuFile can use for a file, or why none (finding id and evidence).
///
/// Rules (cuFile API reference and GDS troubleshooting guide): native GDS needs nvidia-fs (or
/// `use_pci_p2pdma`) and an O_DIRECT descriptor; otherwise cuFile runs in compatibility mode
/// if `allow_compat_mode` is not false (file and driver flags), else nothing is possible.
/// `driver` is `None` when libcufile could not be loaded or opened (`gds.cufile-missing`).
pub fn decide(
    facts: &GdsFacts,
    settings: &CufileSettings,
    driver: Option<&DriverView>,
    file_has_odirect: bool,
) -> Result<GdsDecision, (&'static str, String)> {
    let Some(driver) = driver else {
        return Err((
            ids::GDS_CUFILE_MISSING,
            "libcufile could not be loaded or its driver did not open".into(),
        ));
    };
    let p2pdma = settings.use_pci_p2pdma == Some(true);
    let native_possible = facts.nvidia_fs_loaded() || driver.nvfs_loaded || p2pdma;
    if native_possible && file_has_odirect {
        return Ok(GdsDecision {
            mode: GdsMode::Native,
            finding: None,
            detail: if p2pdma && !facts.nvidia_fs_loaded() {
                "PCI P2PDMA (use_pci_p2pdma)".into()
            } else {
                format!(
                    "nvidia-fs {}",
                    facts.nvidia_fs_version.as_deref().unwrap_or("loaded")
                )
            },
        });
    }
    let (finding, why) = if native_possible {
        (
            ids::STORAGE_ODIRECT_UNSUPPORTED,
            "the file has no O_DIRECT descriptor".to_owned(),
        )
    } else {
        (
            ids::GDS_NVIDIA_FS_MISSING,
            "/proc/driver/nvidia-fs/version absent and nvidia_fs not in /proc/modules".to_owned(),
        )
    };
    let compat_in_file = settings.allow_compat_mode != Some(false);
    if compat_in_file && driver.compat_allowed {
        Ok(GdsDecision {
            mode: GdsMode::Compat,
            finding: Some(finding),
            detail: format!("{why}: cuFile runs in compatibility mode"),
        })
    } else {
        let src = if !compat_in_file {
            format!(
                "allow_compat_mode is false in {}",
                facts.cufile_json.path.display()
            )
        } else {
            "the cuFile driver does not allow compatibility mode (dcontrolflags)".to_owned()
        };
        Err((finding, format!("{why}, and {src}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, text) in files {
            let at = d.path().join(p.trim_start_matches('/'));
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::fs::write(at, text).unwrap();
        }
        d
    }

    const DRV_COMPAT: DriverView = DriverView {
        nvfs_loaded: false,
        compat_allowed: true,
    };

    #[test]
    fn facts_from_trees() {
        let t = tree(&[
            ("/proc/driver/nvidia-fs/version", "version: 2.17\nextra\n"),
            (
                "/proc/modules",
                "nvidia_fs 200704 0 - Live 0x0\nnvidia 1 2 - Live 0x0\n",
            ),
            ("/etc/cufile.json", "{}"),
        ]);
        let f = GdsFacts::gather(t.path(), None);
        assert_eq!(f.nvidia_fs_version.as_deref(), Some("version: 2.17"));
        assert!(f.nvidia_fs_module && f.nvidia_fs_loaded());
        assert_eq!(f.cufile_json.path, PathBuf::from("/etc/cufile.json"));
        assert!(f.cufile_json.exists && !f.cufile_json.from_env);

        // The H200 device machine: no nvidia-fs, no cufile.json; env var points elsewhere.
        let t = tree(&[
            (
                "/proc/modules",
                "nvidia_uvm 1 0 - Live 0x0\nnvidia_fs_x 1 0 - Live 0x0\n",
            ),
            ("/opt/my/cufile.json", "{}"),
        ]);
        let f = GdsFacts::gather(t.path(), Some(OsStr::new("/opt/my/cufile.json")));
        assert_eq!(f.nvidia_fs_version, None);
        assert!(
            !f.nvidia_fs_module,
            "a module merely starting with nvidia_fs is not it"
        );
        assert!(f.cufile_json.from_env && f.cufile_json.exists);
        let f = GdsFacts::gather(t.path(), Some(OsStr::new("")));
        assert!(!f.cufile_json.from_env && !f.cufile_json.exists);
    }

    #[test]
    fn settings_come_from_the_cufile_json_in_force() {
        // Comments as NVIDIA ships them; compat mode switched off, P2PDMA on.
        let json = "{\n  // NOTE: overridable with CUFILE_ENV_PATH_JSON\n  \"properties\": {\n    \
                    /* as shipped */ \"allow_compat_mode\": false,\n    \"use_pci_p2pdma\": true\n  }\n}\n";
        let t = tree(&[("/etc/cufile.json", json)]);
        let f = GdsFacts::gather(t.path(), None);
        let (s, problem) = f.settings(t.path());
        assert_eq!(problem, None);
        assert_eq!(s.allow_compat_mode, Some(false));
        assert_eq!(s.use_pci_p2pdma, Some(true));

        // Absent: cuFile's defaults, no problem. Malformed: defaults, and the reason names it.
        let t = tree(&[]);
        let (s, problem) = GdsFacts::gather(t.path(), None).settings(t.path());
        assert_eq!((s, problem), (CufileSettings::default(), None));
        let t = tree(&[("/etc/cufile.json", "{ \"properties\": { ")]);
        let (s, problem) = GdsFacts::gather(t.path(), None).settings(t.path());
        assert_eq!(s, CufileSettings::default());
        assert!(problem.unwrap().contains("/etc/cufile.json"));
    }

    #[test]
    fn decisions() {
        let none = GdsFacts::gather(tree(&[]).path(), None);
        let nvfs = GdsFacts::gather(
            tree(&[("/proc/driver/nvidia-fs/version", "2.17")]).path(),
            None,
        );
        let dflt = CufileSettings::default();
        // No libcufile.
        assert_eq!(
            decide(&none, &dflt, None, true).unwrap_err().0,
            ids::GDS_CUFILE_MISSING
        );
        // nvidia-fs + O_DIRECT: native.
        let d = decide(&nvfs, &dflt, Some(&DRV_COMPAT), true).unwrap();
        assert_eq!((d.mode, d.finding), (GdsMode::Native, None));
        // nvidia-fs but no O_DIRECT: compat, because of O_DIRECT.
        let d = decide(&nvfs, &dflt, Some(&DRV_COMPAT), false).unwrap();
        assert_eq!(
            (d.mode, d.finding),
            (GdsMode::Compat, Some(ids::STORAGE_ODIRECT_UNSUPPORTED))
        );
        // The device machine: compat, because nvidia-fs is missing.
        let d = decide(&none, &dflt, Some(&DRV_COMPAT), true).unwrap();
        assert_eq!(
            (d.mode, d.finding),
            (GdsMode::Compat, Some(ids::GDS_NVIDIA_FS_MISSING))
        );
        // Compat switched off in cufile.json, or by the driver: nothing.
        let off = CufileSettings {
            allow_compat_mode: Some(false),
            ..dflt
        };
        let e = decide(&none, &off, Some(&DRV_COMPAT), true).unwrap_err();
        assert_eq!(e.0, ids::GDS_NVIDIA_FS_MISSING);
        assert!(
            e.1.contains("allow_compat_mode is false in /etc/cufile.json"),
            "{}",
            e.1
        );
        let strict = DriverView {
            compat_allowed: false,
            ..DRV_COMPAT
        };
        assert!(decide(&none, &dflt, Some(&strict), true)
            .unwrap_err()
            .1
            .contains("dcontrolflags"));
        // PCI P2PDMA makes native possible without nvidia-fs.
        let p2p = CufileSettings {
            use_pci_p2pdma: Some(true),
            ..dflt
        };
        let d = decide(&none, &p2p, Some(&DRV_COMPAT), true).unwrap();
        assert_eq!(d.mode, GdsMode::Native);
        assert!(d.detail.contains("P2PDMA"));
        // The driver itself reporting nvfs counts too.
        let drv = DriverView {
            nvfs_loaded: true,
            compat_allowed: true,
        };
        assert_eq!(
            decide(&none, &dflt, Some(&drv), true).unwrap().mode,
            GdsMode::Native
        );
    }
}
