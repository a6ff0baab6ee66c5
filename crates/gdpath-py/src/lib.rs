//! The Python module `gdpath` (its native part, `gdpath._native`): the engine's agent,
//! registration of Python objects in place (buffer protocol, DLPack,
//! `__cuda_array_interface__`), transfers that release the GIL and complete into asyncio
//! through an eventfd, the network, safetensors checkpoints through the engine's loader, and
//! the topology and doctor documents. It parses and presents; every rule is the engine's.
//! The Python half (`python/gdpath`) holds the exceptions, the asyncio glue and
//! `gdpath.safetensors`. Reference: `docs/python.md`.
//!
//! `unsafe` is confined to the modules that take raw memory from Python objects (the buffer
//! protocol, DLPack capsules, `__cuda_array_interface__` pointers, NumPy/torch id arrays read in
//! place); each block says why it holds.

#![deny(unsafe_code)]

mod agent;
#[allow(unsafe_code)]
mod blocks;
#[allow(unsafe_code)]
mod buffer;
mod checkpoint;
mod cluster;
#[allow(unsafe_code)]
mod dlpack;
mod error;
mod geometry;
mod json_documents;
#[allow(unsafe_code)]
mod memory;
mod metrics;
mod net;
mod region;
mod transfer;
mod waker;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<agent::Agent>()?;
    m.add_class::<cluster::ClusterPeer>()?;
    m.add_class::<cluster::ClusterWatch>()?;
    m.add_class::<region::Region>()?;
    m.add_class::<region::Descriptor>()?;
    m.add_class::<memory::File>()?;
    m.add_class::<transfer::Transfer>()?;
    m.add_class::<transfer::TransferReport>()?;
    m.add_class::<transfer::PairReport>()?;
    m.add_class::<transfer::PlannedPair>()?;
    m.add_class::<waker::Waker>()?;
    m.add_class::<net::Server>()?;
    m.add_class::<net::Peer>()?;
    m.add_class::<net::RemoteRegion>()?;
    m.add_class::<net::Notification>()?;
    m.add_class::<checkpoint::Checkpoint>()?;
    m.add_class::<checkpoint::Loaded>()?;
    m.add_class::<checkpoint::TensorInfo>()?;
    m.add_class::<dlpack::View>()?;
    blocks::register(m)?;
    m.add_function(wrap_pyfunction!(json_documents::topo_json, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::metrics_text, m)?)?;
    m.add_function(wrap_pyfunction!(json_documents::doctor_json, m)?)?;
    m.add("NOTIFICATION_TOKEN", agent::NOTIFICATION_TOKEN)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
