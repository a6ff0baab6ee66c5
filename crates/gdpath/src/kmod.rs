//! Whether a kernel module is loaded, read through a [`SysView`] (live `/`, a copied tree or a
//! snapshot), for the engine's path decisions and the doctor alike.

use gdpath_topo::view::SysView;

/// Whether kernel module `name` is loaded: `/sys/module/<name>` exists (listable), or
/// `/proc/modules` has a line for it (its first word, so `nvidia_fs_x` is not `nvidia_fs`).
/// `None` when neither can be read (a source without them). Returns the evidence with it.
pub fn module_state(view: &dyn SysView, name: &str) -> (Option<bool>, String) {
    if view.read_dir(&format!("/sys/module/{name}")).is_ok() {
        return (Some(true), format!("/sys/module/{name} present"));
    }
    if let Some(mods) = view.read_text("/proc/modules") {
        let found = mods
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name));
        return (
            Some(found),
            format!(
                "/proc/modules: {name} {}",
                if found { "listed" } else { "not listed" }
            ),
        );
    }
    if view.read_dir("/sys/module").is_ok() {
        return (Some(false), format!("/sys/module/{name} absent"));
    }
    (
        None,
        "/sys/module and /proc/modules not readable".to_owned(),
    )
}
