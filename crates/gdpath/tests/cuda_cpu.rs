//! The `cuda` backend on a machine without an NVIDIA driver (CI): the loader's error reaches the
//! caller, GPU and pinned memory are refused with a typed error naming the backend, host paths
//! still work, and GPU settings are validated. Where a driver is installed the absence checks
//! say they skipped.

use gdpath::backend::cuda::CudaBackend;
use gdpath::{Agent, AgentConfig, Error, GpuConfig, GpuPointer, HostBuffer, Memory};

fn driver_present() -> bool {
    match gdpath_cuda::gather_facts() {
        Ok(f) => {
            eprintln!(
                "SKIPPED: an NVIDIA driver is installed here ({} GPUs); absence not testable",
                f.gpus.len()
            );
            true
        }
        Err(_) => false,
    }
}

#[test]
fn backend_reports_the_missing_driver_library() {
    if driver_present() {
        return;
    }
    let e = CudaBackend::new(GpuConfig::default()).unwrap_err();
    let Error::Unsupported { what, backend } = &e else {
        panic!("expected Unsupported, got {e:?}")
    };
    assert_eq!(*backend, "cuda");
    assert!(what.contains("libcuda.so.1"), "names the library: {what}");
    assert!(
        what.contains("NVIDIA driver"),
        "says what installs it: {what}"
    );
}

#[test]
fn gpu_and_pinned_memory_are_refused_without_a_driver() {
    if driver_present() {
        return;
    }
    let agent = Agent::new(AgentConfig::default()).unwrap();
    assert!(agent.backends().iter().all(|b| b.name != "cuda"));
    let e = agent
        .register(Memory::Gpu {
            ordinal: 0,
            len: 4096,
        })
        .unwrap_err();
    assert!(
        matches!(&e, Error::Unsupported { backend: "cuda", what } if what.contains("GPU 0")),
        "{e:?}"
    );
    for m in [
        // SAFETY: never dereferenced: registration fails before anything touches the pointer.
        Memory::GpuPointer(unsafe { GpuPointer::new(1, 0x7000_0000, 64) }),
        Memory::pinned(HostBuffer::zeroed(4096)),
    ] {
        let e = agent.register(m).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Unsupported {
                    backend: "cuda",
                    ..
                }
            ),
            "{e:?}"
        );
    }
    // Pageable host memory still works.
    let r = agent
        .register(Memory::host(HostBuffer::zeroed(4096)))
        .unwrap();
    assert_eq!(r.len().unwrap(), 4096);
}

#[test]
fn gpu_settings_are_validated_by_name() {
    let bad = [
        (
            GpuConfig {
                chunk: 512,
                ..GpuConfig::default()
            },
            "chunk",
        ),
        (
            GpuConfig {
                staging_buffers: 1,
                ..GpuConfig::default()
            },
            "staging buffers",
        ),
        (
            GpuConfig {
                copy_threads: 0,
                ..GpuConfig::default()
            },
            "copy threads",
        ),
        (
            GpuConfig {
                workers: 0,
                ..GpuConfig::default()
            },
            "workers",
        ),
    ];
    for (gpu, word) in bad {
        let e = Agent::new(AgentConfig {
            gpu,
            ..AgentConfig::default()
        })
        .unwrap_err();
        assert!(
            matches!(&e, Error::Config(m) if m.contains(word)),
            "{word}: {e}"
        );
    }
    GpuConfig::default().validate().unwrap();
    assert!(GpuConfig::default().copy_threads >= 2);
}

#[test]
fn gpu_pointer_keeps_what_it_was_given() {
    // SAFETY: only read back, never dereferenced.
    let p = unsafe { GpuPointer::new(3, 0xdead_0000, 1 << 20) };
    assert_eq!((p.ordinal(), p.ptr(), p.len()), (3, 0xdead_0000, 1 << 20));
    assert!(!p.is_empty());
    assert_eq!(
        Memory::GpuPointer(p).kind(),
        gdpath::MemoryKind::Gpu { ordinal: 3 }
    );
}
