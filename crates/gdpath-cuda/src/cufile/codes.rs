//! cuFile's `CUfileOpError` codes: names and texts, and the typed error for a code.

use crate::error::CudaError;

/// `CUfileOpError` codes with their names and cuFile's short description of each (the strings
/// cufile.h's `cufileop_status_error` gives, so that messages match NVIDIA's tools and logs).
const CODES: &[(i32, &str, &str)] = &[
    (0, "CU_FILE_SUCCESS", "cufile success"),
    (
        5001,
        "CU_FILE_DRIVER_NOT_INITIALIZED",
        "nvidia-fs driver is not loaded",
    ),
    (5002, "CU_FILE_DRIVER_INVALID_PROPS", "invalid property"),
    (
        5003,
        "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        "property range error",
    ),
    (
        5004,
        "CU_FILE_DRIVER_VERSION_MISMATCH",
        "nvidia-fs driver version mismatch",
    ),
    (
        5005,
        "CU_FILE_DRIVER_VERSION_READ_ERROR",
        "nvidia-fs driver version read error",
    ),
    (
        5006,
        "CU_FILE_DRIVER_CLOSING",
        "driver shutdown in progress",
    ),
    (
        5007,
        "CU_FILE_PLATFORM_NOT_SUPPORTED",
        "GPUDirect Storage not supported on current platform",
    ),
    (
        5008,
        "CU_FILE_IO_NOT_SUPPORTED",
        "GPUDirect Storage not supported on current file",
    ),
    (
        5009,
        "CU_FILE_DEVICE_NOT_SUPPORTED",
        "GPUDirect Storage not supported on current GPU",
    ),
    (
        5010,
        "CU_FILE_NVFS_DRIVER_ERROR",
        "nvidia-fs driver ioctl error",
    ),
    (5011, "CU_FILE_CUDA_DRIVER_ERROR", "CUDA Driver API error"),
    (
        5012,
        "CU_FILE_CUDA_POINTER_INVALID",
        "invalid device pointer",
    ),
    (
        5013,
        "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        "invalid pointer memory type",
    ),
    (
        5014,
        "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        "pointer range exceeds allocated address range",
    ),
    (
        5015,
        "CU_FILE_CUDA_CONTEXT_MISMATCH",
        "cuda context mismatch",
    ),
    (
        5016,
        "CU_FILE_INVALID_MAPPING_SIZE",
        "access beyond maximum pinned size",
    ),
    (
        5017,
        "CU_FILE_INVALID_MAPPING_RANGE",
        "access beyond mapped size",
    ),
    (5018, "CU_FILE_INVALID_FILE_TYPE", "unsupported file type"),
    (
        5019,
        "CU_FILE_INVALID_FILE_OPEN_FLAG",
        "unsupported file open flags",
    ),
    (5020, "CU_FILE_DIO_NOT_SET", "fd direct IO not set"),
    (5022, "CU_FILE_INVALID_VALUE", "invalid arguments"),
    (
        5023,
        "CU_FILE_MEMORY_ALREADY_REGISTERED",
        "device pointer already registered",
    ),
    (
        5024,
        "CU_FILE_MEMORY_NOT_REGISTERED",
        "device pointer lookup failure",
    ),
    (
        5025,
        "CU_FILE_PERMISSION_DENIED",
        "driver or file access error",
    ),
    (
        5026,
        "CU_FILE_DRIVER_ALREADY_OPEN",
        "driver is already open",
    ),
    (
        5027,
        "CU_FILE_HANDLE_NOT_REGISTERED",
        "file descriptor is not registered",
    ),
    (
        5028,
        "CU_FILE_HANDLE_ALREADY_REGISTERED",
        "file descriptor is already registered",
    ),
    (5029, "CU_FILE_DEVICE_NOT_FOUND", "GPU device not found"),
    (5030, "CU_FILE_INTERNAL_ERROR", "internal error"),
    (
        5031,
        "CU_FILE_GETNEWFD_FAILED",
        "failed to obtain new file descriptor",
    ),
    (
        5033,
        "CU_FILE_NVFS_SETUP_ERROR",
        "NVFS driver initialization error",
    ),
    (
        5034,
        "CU_FILE_IO_DISABLED",
        "GPUDirect Storage disabled by config on current file",
    ),
    (
        5035,
        "CU_FILE_BATCH_SUBMIT_FAILED",
        "failed to submit batch operation",
    ),
    (
        5036,
        "CU_FILE_GPU_MEMORY_PINNING_FAILED",
        "failed to allocate pinned GPU memory",
    ),
    (5037, "CU_FILE_BATCH_FULL", "queue full for batch operation"),
    (
        5038,
        "CU_FILE_ASYNC_NOT_SUPPORTED",
        "cuFile stream operation not supported",
    ),
    (
        5039,
        "CU_FILE_INTERNAL_BATCH_SETUP_ERROR",
        "batch setup failed",
    ),
    (
        5040,
        "CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR",
        "batch submit failed",
    ),
    (
        5041,
        "CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR",
        "batch get status failed",
    ),
    (
        5042,
        "CU_FILE_INTERNAL_BATCH_CANCEL_ERROR",
        "batch cancel failed",
    ),
    (5043, "CU_FILE_NOMEM_ERROR", "out of memory"),
    (5044, "CU_FILE_IO_ERROR", "IO error"),
    (
        5045,
        "CU_FILE_INTERNAL_BUF_REGISTER_ERROR",
        "internal buffer registration error",
    ),
    (5046, "CU_FILE_HASH_OPR_ERROR", "hash operation error"),
    (
        5047,
        "CU_FILE_INVALID_CONTEXT_ERROR",
        "invalid CUDA context",
    ),
    (
        5048,
        "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR",
        "nvidia-fs internal driver error",
    ),
    (
        5049,
        "CU_FILE_BATCH_NOCOMPAT_ERROR",
        "batch I/O not supported in compatibility mode",
    ),
];

/// Name and cuFile's text for a `CUfileOpError` code; unknown codes (from a newer libcufile)
/// get a generic name rather than being misread.
pub fn error_text(code: i32) -> (&'static str, &'static str) {
    CODES
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, t)| (*n, *t))
        .unwrap_or((
            "CU_FILE_UNKNOWN_ERROR",
            "error code unknown to gdpath (newer libcufile?)",
        ))
}

/// Build the typed error for a cuFile call's result code.
pub fn cufile_error(call: &'static str, code: i32, cu_result: i32) -> CudaError {
    let (name, message) = error_text(code);
    CudaError::CuFile {
        call,
        code,
        name,
        message,
        cu_result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_names_the_code() {
        assert_eq!(
            error_text(5027),
            (
                "CU_FILE_HANDLE_NOT_REGISTERED",
                "file descriptor is not registered"
            )
        );
        assert_eq!(error_text(5020).0, "CU_FILE_DIO_NOT_SET");
        assert_eq!(error_text(9999).0, "CU_FILE_UNKNOWN_ERROR");
        let e = cufile_error("cuFileHandleRegister", 5027, 0);
        let s = e.to_string();
        assert!(s.contains("cuFileHandleRegister"), "{s}");
        assert!(s.contains("file descriptor is not registered"), "{s}");
        assert!(s.contains("5027"), "{s}");
        assert!(matches!(e, CudaError::CuFile { code: 5027, .. }), "{e:?}");
    }

    #[test]
    fn codes_are_unique_and_sorted() {
        for w in CODES.windows(2) {
            assert!(w[0].0 < w[1].0, "{:?} then {:?}", w[0], w[1]);
        }
    }
}
