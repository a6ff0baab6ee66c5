//! GPUDirect Storage facts and the decision between the GDS paths.
//!
//! [`GdsFacts::gather`] reads what decides whether cuFile can do native GDS, through a
//! [`SysView`] (the live machine, a copied tree or a snapshot — the same reader the doctor
//! uses, so the engine's decision and the doctor's findings rest on the same facts):
//! nvidia-fs (`/proc/driver/nvidia-fs/version`, else the module in `/sys/module` or
//! `/proc/modules`) and which `cufile.json` is in force (`$CUFILE_ENV_PATH_JSON`, else
//! `/etc/cufile.json`, per the cuFile API reference). That file is parsed by
//! [`crate::cufile_json`] (one parser for engine and doctor) into [`CufileSettings`].
//! [`decide`] then says which GDS path cuFile can take, or why none.

use crate::finding::ids;
use gdpath_topo::view::SysView;
use std::path::PathBuf;

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
    /// Whether the file exists (is readable through the view). Without it cuFile uses built-in
    /// defaults.
    pub exists: bool,
}

/// Facts that decide the GDS path, read from files only (no library is loaded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdsFacts {
    /// The text of `/proc/driver/nvidia-fs/version` (first line, trimmed), when present.
    pub nvidia_fs_version: Option<String>,
    /// The `nvidia_fs` module is loaded (`/sys/module` or `/proc/modules`); `None` when the
    /// source has neither ([`crate::kmod::module_state`]).
    pub nvidia_fs_module: Option<bool>,
    /// Where `nvidia_fs_module` came from (`/proc/modules: nvidia_fs not listed`, ...).
    pub nvidia_fs_evidence: String,
    /// Which `cufile.json` cuFile reads, and whether it exists.
    pub cufile_json: CufileJsonSource,
}

impl GdsFacts {
    /// Reads the facts through `view` ([`gdpath_topo::DirView::live`] for this machine).
    /// `cufile_env` is the value of `$CUFILE_ENV_PATH_JSON` (live: `std::env::var`; a replay:
    /// the captured environment); an empty value counts as unset. Missing files are facts
    /// (absent), not errors.
    pub fn gather(view: &dyn SysView, cufile_env: Option<&str>) -> GdsFacts {
        let nvidia_fs_version = view
            .read_text("/proc/driver/nvidia-fs/version")
            .map(|t| t.lines().next().unwrap_or("").trim().to_owned());
        let (nvidia_fs_module, nvidia_fs_evidence) = crate::kmod::module_state(view, "nvidia_fs");
        let (path, from_env) = match cufile_env.map(str::trim).filter(|v| !v.is_empty()) {
            Some(v) => (PathBuf::from(v), true),
            None => (PathBuf::from(CUFILE_DEFAULT_JSON), false),
        };
        // Only "not found" means cuFile's built-in defaults; an unreadable file is reported
        // by `settings` (and by the doctor) instead of passing for absent.
        let exists = !matches!(
            view.read(&path.to_string_lossy()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound
        );
        GdsFacts {
            nvidia_fs_version,
            nvidia_fs_module,
            nvidia_fs_evidence,
            cufile_json: CufileJsonSource {
                path,
                from_env,
                exists,
            },
        }
    }

    /// nvidia-fs is loaded (its proc file exists, or the module is listed).
    pub fn nvidia_fs_loaded(&self) -> bool {
        self.nvidia_fs_version.is_some() || self.nvidia_fs_module == Some(true)
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
    /// The settings of the `cufile.json` in force, read through `view`. A missing file gives
    /// cuFile's defaults; an unreadable or malformed one gives them too, with the reason
    /// (cuFile itself then refuses to start, which the doctor reports as `gds.cufile-config`).
    pub fn settings(&self, view: &dyn SysView) -> (CufileSettings, Option<String>) {
        if !self.cufile_json.exists {
            return (CufileSettings::default(), None);
        }
        let path = &self.cufile_json.path;
        match view.read(&path.to_string_lossy()) {
            Ok(bytes) => {
                match crate::cufile_json::CufileConfig::parse(&String::from_utf8_lossy(&bytes)) {
                    Ok(c) => (CufileSettings::from_config(&c), None),
                    Err(e) => (
                        CufileSettings::default(),
                        Some(format!("{}: {e}", path.display())),
                    ),
                }
            }
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
    /// DMA between storage and GPU memory (`DataPath::GdsNative`).
    Native,
    /// cuFile's POSIX fallback through its own bounce buffers (`DataPath::GdsCompat`).
    Compat,
}

/// The decision: the mode and, when it is not native, the finding that says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdsDecision {
    /// The mode cuFile will run in.
    pub mode: GdsMode,
    /// `gds.nvidia-fs-missing` (or `storage.odirect-unsupported`) for compat mode.
    pub finding: Option<&'static str>,
    /// The evidence: what carries native I/O (nvidia-fs and its version, or PCI P2PDMA), or
    /// why cuFile runs in compatibility mode.
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

    use gdpath_topo::DirView;

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
        let f = GdsFacts::gather(&DirView::new(t.path()), None);
        assert_eq!(f.nvidia_fs_version.as_deref(), Some("version: 2.17"));
        assert!(f.nvidia_fs_module == Some(true) && f.nvidia_fs_loaded());
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
        let f = GdsFacts::gather(&DirView::new(t.path()), Some("/opt/my/cufile.json"));
        assert_eq!(f.nvidia_fs_version, None);
        assert_eq!(
            f.nvidia_fs_module,
            Some(false),
            "a module merely starting with nvidia_fs is not it"
        );
        assert!(f.cufile_json.from_env && f.cufile_json.exists);
        let f = GdsFacts::gather(&DirView::new(t.path()), Some(""));
        assert!(!f.cufile_json.from_env && !f.cufile_json.exists);
    }

    #[test]
    fn settings_come_from_the_cufile_json_in_force() {
        // Comments as NVIDIA ships them; compat mode switched off, P2PDMA on.
        let json = "{\n  // NOTE: overridable with CUFILE_ENV_PATH_JSON\n  \"properties\": {\n    \
                    /* as shipped */ \"allow_compat_mode\": false,\n    \"use_pci_p2pdma\": true\n  }\n}\n";
        let t = tree(&[("/etc/cufile.json", json)]);
        let f = GdsFacts::gather(&DirView::new(t.path()), None);
        let (s, problem) = f.settings(&DirView::new(t.path()));
        assert_eq!(problem, None);
        assert_eq!(s.allow_compat_mode, Some(false));
        assert_eq!(s.use_pci_p2pdma, Some(true));

        // Absent: cuFile's defaults, no problem. Malformed: defaults, and the reason names it.
        let t = tree(&[]);
        let (s, problem) =
            GdsFacts::gather(&DirView::new(t.path()), None).settings(&DirView::new(t.path()));
        assert_eq!((s, problem), (CufileSettings::default(), None));
        let t = tree(&[("/etc/cufile.json", "{ \"properties\": { ")]);
        let (s, problem) =
            GdsFacts::gather(&DirView::new(t.path()), None).settings(&DirView::new(t.path()));
        assert_eq!(s, CufileSettings::default());
        assert!(problem.unwrap().contains("/etc/cufile.json"));
    }

    #[test]
    fn decisions() {
        let none = GdsFacts::gather(&DirView::new(tree(&[]).path()), None);
        let nvfs = GdsFacts::gather(
            &DirView::new(tree(&[("/proc/driver/nvidia-fs/version", "2.17")]).path()),
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
