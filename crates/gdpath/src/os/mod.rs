//! The engine's calls into the operating system that the standard library does not make, each
//! behind a safe function: one place for them, using `nix` where it covers the call.

mod cache;
mod dl;
mod process;

pub use cache::evict_page_cache;
pub use dl::library_exports;
pub use process::exit_immediately;
