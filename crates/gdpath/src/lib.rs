//! gdpath: the engine for the GPUDirect data paths (P2P, GDR, GDS) and their host-memory
//! fallbacks. See `DESIGN.md` for the layers; this crate sits between the hardware layers
//! (`gdpath-topo`, `gdpath-cuda`, `gdpath-ucx`) and the `gdpath` command.

pub mod doctor;
pub mod finding;
pub mod machine;
pub mod path;

pub use finding::{Area, Finding, FindingId, Status};
pub use gdpath_topo as topo;
pub use path::Path;
