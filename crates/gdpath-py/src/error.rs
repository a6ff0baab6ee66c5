//! Engine errors as Python exceptions. The classes are defined in Python
//! (`python/gdpath/errors.py`: `GdpathError` with `.kind` and `.finding`, and subclasses chosen
//! by kind); this module hands each error's kind, message, finding id and details to
//! `gdpath.errors._from_native`, which builds the exception.

use gdpath::Error;
use gdpath_checkpoint::{CheckpointError, LoadError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use std::path::Path;

static FROM_NATIVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// An exception of kind `kind` (an engine [`Error::kind`], `checkpoint`, or one of the
/// binding's own: `usage`, `topology`) with `message`, the finding id that explains it and
/// `details` (attributes set on the exception).
pub fn raise(
    py: Python<'_>,
    kind: &str,
    message: &str,
    finding: Option<&str>,
    details: Option<Bound<'_, PyDict>>,
) -> PyErr {
    let make = FROM_NATIVE.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(py
            .import("gdpath.errors")?
            .getattr("_from_native")?
            .unbind())
    });
    let made = make.and_then(|f| f.bind(py).call1((kind, message, finding, details)));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        // The package is broken (errors.py missing): say so rather than lose the error.
        Err(e) => e,
    }
}

/// The finding id an engine error carries (refusals and strict-mode failures).
pub(crate) fn finding_of(e: &Error) -> Option<String> {
    match e {
        Error::Refused { finding, .. } | Error::PathNotAccepted { finding, .. } => {
            finding.as_ref().map(|f| f.as_str().to_owned())
        }
        _ => None,
    }
}

/// Details an engine error names (set as attributes): the descriptor index, the side, the
/// planned path of a strict-mode failure.
pub(crate) fn details_of<'py>(py: Python<'py>, e: &Error) -> PyResult<Option<Bound<'py, PyDict>>> {
    let d = PyDict::new(py);
    match e {
        Error::OutOfBounds { index, side, .. } => {
            d.set_item("index", index)?;
            d.set_item("side", side.to_string())?;
        }
        Error::PairLengthMismatch { index, .. }
        | Error::NoPath { index, .. }
        | Error::Refused { index, .. } => d.set_item("index", index)?,
        Error::PathNotAccepted { index, planned, .. } => {
            d.set_item("index", index)?;
            d.set_item("planned", planned.as_ref().map(|p| p.name()))?;
        }
        Error::Open { path, source }
        | Error::CreateIn { dir: path, source }
        | Error::Io { path, source, .. }
        | Error::NoSpace { path, source, .. } => os_details(&d, path, Some(source))?,
        Error::Exists { path } | Error::MagicLinkRefused { path, .. } => {
            os_details(&d, path, None)?
        }
        Error::NotAFile { path, what } => os_details(
            &d,
            path,
            not_a_file_errno(what).map(std::io::Error::from).as_ref(),
        )?,
        // EACCES: what open(2) returns where the kernel applies the rule itself.
        Error::SymlinkRefused { link: path, .. } | Error::ForeignFileRefused { path, .. } => {
            os_details(
                &d,
                path,
                Some(&std::io::Error::from(nix::errno::Errno::EACCES)),
            )?
        }
        _ => return Ok(None),
    }
    Ok(Some(d))
}

/// The errno `open(2)` gives for what [`Error::NotAFile`] refused (`what`, in its words), so
/// Python raises the `OSError` subclass `open()` would: `EISDIR` for a directory (or a path
/// that can only name one), `ENXIO` for a FIFO or socket (as a FIFO without a reader opened for
/// writing without blocking, and a socket, give), `ENOENT` for a dangling link; none for a
/// device, which `open(2)` would open.
fn not_a_file_errno(what: &str) -> Option<nix::errno::Errno> {
    use nix::errno::Errno;
    if what.starts_with("a directory") || what == "a symbolic link to a directory" {
        Some(Errno::EISDIR)
    } else if matches!(what, "a FIFO" | "a socket") {
        Some(Errno::ENXIO)
    } else if what == "a dangling symbolic link" {
        Some(Errno::ENOENT)
    } else {
        None
    }
}

/// `errno` and `filename` of a file error, so that Python raises it as the `OSError` subclass
/// its errno names (`FileNotFoundError` for `ENOENT`, ...), as `open()` would.
fn os_details(d: &Bound<'_, PyDict>, path: &Path, source: Option<&std::io::Error>) -> PyResult<()> {
    d.set_item("filename", path.as_os_str())?;
    if let Some(n) = source.and_then(|s| s.raw_os_error()) {
        d.set_item("errno", n)?;
    }
    Ok(())
}

/// An engine error as a Python exception.
pub fn engine(py: Python<'_>, e: &Error) -> PyErr {
    engine_with_message(py, e, &e.to_string())
}

/// An engine error with another message (one that names the file, say).
fn engine_with_message(py: Python<'_>, e: &Error, message: &str) -> PyErr {
    let details = details_of(py, e).unwrap_or(None);
    raise(py, e.kind(), message, finding_of(e).as_deref(), details)
}

/// A checkpoint load's error: `checkpoint` for a malformed file or index, the engine's kind
/// for the rest.
pub fn load(py: Python<'_>, e: &LoadError) -> PyErr {
    match e {
        LoadError::Engine { error, .. } => engine_with_message(py, error, &e.to_string()),
        LoadError::Checkpoint { error, .. } => {
            let details = match error {
                CheckpointError::Open { path, source }
                | CheckpointError::Io { path, source, .. } => {
                    let d = PyDict::new(py);
                    match os_details(&d, path, Some(source)) {
                        Ok(()) => Some(d),
                        Err(err) => return err,
                    }
                }
                _ => None,
            };
            raise(py, e.kind(), &e.to_string(), None, details)
        }
    }
}

/// `Result<T, gdpath::Error>` → `PyResult<T>`.
pub trait IntoPy<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| engine(py, &e))
    }
}

impl<T> IntoPy<T> for Result<T, LoadError> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| load(py, &e))
    }
}

/// The name of `obj`'s type for a message (`"ndarray"`, `"str"`), empty if it has none.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// An optional string for a repr: `None`, or the string quoted (Rust's `Some("...")` would leak
/// into the Python text; the quoting is Rust's `{:?}`, double quotes).
pub(crate) fn opt_repr(o: Option<&str>) -> String {
    o.map_or_else(|| "None".to_owned(), |s| format!("{s:?}"))
}

/// `value` as a CUDA ordinal for argument `arg` (`gpu=`): a `ValueError` naming the argument for
/// a negative or too large one, where PyO3's conversion to `u32` would raise `OverflowError`.
pub(crate) fn ordinal(arg: &str, value: Option<i64>) -> PyResult<Option<u32>> {
    value
        .map(|v| {
            u32::try_from(v).map_err(|_| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "{arg}={v}: a CUDA ordinal is 0 or more (and below 2**32)"
                ))
            })
        })
        .transpose()
}
