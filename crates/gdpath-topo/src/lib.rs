//! The machine model for gdpath: PCI devices, the PCIe tree, NUMA, and the pair classes of
//! `nvidia-smi topo -m`. Pure Rust, no FFI, no unsafe.

#![forbid(unsafe_code)]

pub mod facts;
