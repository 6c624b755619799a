//! The one table of Triton error texts that clients and Triton's own
//! examples match on. Each function builds the exact message Triton's
//! server writes (see `server/src/common.cc` and
//! `server/src/shared_memory_manager.cc`), with the error kind Triton
//! gives it. Everything else may word its errors freely; a text listed
//! here must not change without a client-visible reason, and each has a
//! test below.

use crate::types::{clip, ErrorKind, InferError};

/// A model version that is not an integer (`std::stol` failed in Triton,
/// whose exception text is `stol`).
/// `grpc_explicit_int8_content_client.py` matches the prefix up to the
/// quoted version.
pub fn bad_version_string(version: &str) -> InferError {
    InferError::invalid(format!(
        "failed to get model version from specified version string '{}' (details: stol), \
         version should be an integral value > 0",
        clip(version)
    ))
}

/// A negative model version.
pub fn negative_version(version: &str) -> InferError {
    InferError::invalid(format!(
        "invalid model version specified '{}' , version should be an integral value > 0",
        clip(version)
    ))
}

/// Parses a request's model version the way Triton does: empty is "the
/// latest" (`None`), else a non-negative integer. Unlike `std::stol`,
/// trailing garbage (`"1abc"`) is refused rather than ignored.
pub fn parse_model_version(version: &str) -> Result<Option<i64>, InferError> {
    if version.is_empty() {
        return Ok(None);
    }
    let v: i64 = version
        .trim_start()
        .parse()
        .map_err(|_| bad_version_string(version))?;
    if v < 0 {
        return Err(negative_version(version));
    }
    Ok(Some(v))
}

/// A request naming a model the server does not have.
pub fn unknown_model(name: &str) -> InferError {
    InferError::not_found(format!(
        "Request for unknown model: '{}' is not found",
        clip(name)
    ))
}

/// A system shared memory region registered twice under one name.
pub fn shm_already_registered(name: &str) -> InferError {
    InferError::new(
        ErrorKind::AlreadyExists,
        format!("shared memory region '{}' already in manager", clip(name)),
    )
}

/// A region name no registration has (inference inputs and outputs).
pub fn shm_unknown_region(name: &str) -> InferError {
    InferError::not_found(format!(
        "Unable to find shared memory region: '{}'",
        clip(name)
    ))
}

/// A region name no registration has (status of one system region).
pub fn shm_unknown_system_region(name: &str) -> InferError {
    InferError::not_found(format!(
        "Unable to find system shared memory region: '{}'",
        clip(name)
    ))
}

/// `shm_open` failed for the key given at registration.
pub fn shm_cannot_open(key: &str) -> InferError {
    InferError::internal(format!(
        "Unable to open shared memory region: '{}'",
        clip(key)
    ))
}

/// Registration with `offset + byte_size` beyond the shm object's size.
pub fn shm_register_invalid_args(name: &str) -> InferError {
    InferError::invalid(format!(
        "failed to register shared memory region '{}': invalid args",
        clip(name)
    ))
}

/// A key made only of slashes.
pub fn shm_invalid_key(name: &str, key: &str) -> InferError {
    InferError::invalid(format!(
        "cannot register shared memory region '{}' - invalid shm key '{}'",
        clip(name),
        clip(key)
    ))
}

/// A region whose shm object the client shrank below the region's end
/// after registering it (no Triton text: Triton dies of SIGBUS).
pub fn shm_truncated(name: &str, key: &str, end: u64) -> InferError {
    InferError::invalid(format!(
        "shared memory region '{}' is unusable: its shm object '{}' was truncated below \
         the region's end ({end} bytes) after registration; unregister the region and \
         register it again",
        clip(name),
        clip(key)
    ))
}

/// An inference offset at or past the end of the region.
pub fn shm_invalid_offset(name: &str) -> InferError {
    InferError::invalid(format!(
        "Invalid offset for shared memory region: '{}'",
        clip(name)
    ))
}

/// An inference `offset + byte_size` past the end of the region.
pub fn shm_invalid_range(name: &str) -> InferError {
    InferError::invalid(format!(
        "Invalid offset + byte size for shared memory region: '{}'",
        clip(name)
    ))
}

/// Registering a CUDA region on a server without GPU support (Triton
/// built without `TRITON_ENABLE_GPU` answers INVALID_ARG).
pub fn cuda_shm_register_no_gpu(name: &str) -> InferError {
    InferError::invalid(format!(
        "failed to register CUDA shared memory region: '{}', GPUs not supported",
        clip(name)
    ))
}

/// Registering a CUDA region with an empty name (HTTP
/// `/v2/cudasharedmemory/register`).
pub fn cuda_shm_register_no_name() -> InferError {
    InferError::invalid("'region name' is necessary to register cuda shared memory region")
}

/// A raw handle that is not 64 bytes (or not base64).
pub fn cuda_shm_bad_handle() -> InferError {
    InferError::invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
}

/// Status of a region of the other kind: `registered` is "system" or
/// "CUDA", `asked` the other.
pub fn shm_wrong_kind(name: &str, registered: &str, asked: &str) -> InferError {
    InferError::not_found(format!(
        "The region named '{}' is registered as {registered} shared memory, not {asked} shared memory",
        clip(name)
    ))
}

/// Status of one CUDA region that is not registered.
pub fn cuda_shm_unknown_region(name: &str) -> InferError {
    InferError::not_found(format!(
        "Unable to find cuda shared memory region: '{}'",
        clip(name)
    ))
}

/// An input whose data is not the size its shape and datatype declare
/// (core `infer_request.cc`): binary inputs, shared-memory inputs and raw
/// binary requests alike.
pub fn input_byte_size_mismatch(input: &str, model: &str, expected: u64, got: u64) -> InferError {
    InferError::invalid(format!(
        "input byte size mismatch for input '{}' for model '{}'. Expected {expected}, got {got}",
        clip(input),
        clip(model)
    ))
}

/// A raw binary request (`Inference-Header-Content-Length: 0`) for a
/// model that does not take exactly one input (core `infer_request.cc`).
pub fn raw_request_input_count(model: &str, config_inputs: usize) -> InferError {
    InferError::invalid(format!(
        "Raw request must only have 1 input (found 1) to be deduced but got {config_inputs} \
         inputs in '{}' model configuration",
        clip(model)
    ))
}

/// A raw binary request whose input has more than one `-1` dimension.
pub fn raw_input_shape_ambiguous(input: &str) -> InferError {
    InferError::invalid(format!(
        "The shape of the raw input '{}' can not be deduced because there are more than one \
         variable-sized dimension",
        clip(input)
    ))
}

/// A raw binary request whose BYTES input is not of one element.
pub fn raw_bytes_input_shape(input: &str) -> InferError {
    InferError::invalid(format!(
        "For BYTE datatype raw input '{}', the model must have input shape [1]",
        clip(input)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_string_is_tritons() {
        let e = parse_model_version("wrong_specification").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        // The substring grpc_explicit_int8_content_client.py checks.
        assert!(e.message.contains(
            "failed to get model version from specified version string 'wrong_specification'"
        ));
        assert_eq!(parse_model_version("").unwrap(), None);
        assert_eq!(parse_model_version("3").unwrap(), Some(3));
        assert!(parse_model_version("1abc").is_err());
    }

    #[test]
    fn negative_version_is_tritons() {
        let e = parse_model_version("-1").unwrap_err();
        assert_eq!(
            e.message,
            "invalid model version specified '-1' , version should be an integral value > 0"
        );
    }

    #[test]
    fn unknown_model_is_tritons() {
        assert_eq!(
            unknown_model("nope").message,
            "Request for unknown model: 'nope' is not found"
        );
    }

    #[test]
    fn shm_texts_are_tritons() {
        let dup = shm_already_registered("r");
        assert_eq!(dup.kind, ErrorKind::AlreadyExists);
        assert_eq!(dup.message, "shared memory region 'r' already in manager");
        assert_eq!(
            shm_unknown_region("r").message,
            "Unable to find shared memory region: 'r'"
        );
        assert_eq!(
            shm_unknown_system_region("r").message,
            "Unable to find system shared memory region: 'r'"
        );
        assert_eq!(
            shm_cannot_open("/k").message,
            "Unable to open shared memory region: '/k'"
        );
        assert_eq!(
            shm_register_invalid_args("r").message,
            "failed to register shared memory region 'r': invalid args"
        );
        assert_eq!(
            shm_invalid_key("r", "//").message,
            "cannot register shared memory region 'r' - invalid shm key '//'"
        );
        assert_eq!(
            shm_invalid_offset("r").message,
            "Invalid offset for shared memory region: 'r'"
        );
        assert_eq!(
            shm_invalid_range("r").message,
            "Invalid offset + byte size for shared memory region: 'r'"
        );
        assert_eq!(
            cuda_shm_unknown_region("c").message,
            "Unable to find cuda shared memory region: 'c'"
        );
        let cuda = cuda_shm_register_no_gpu("c");
        assert_eq!(cuda.kind, ErrorKind::InvalidArgument);
        assert_eq!(
            cuda.message,
            "failed to register CUDA shared memory region: 'c', GPUs not supported"
        );
    }

    #[test]
    fn input_texts_are_tritons() {
        let e = input_byte_size_mismatch("INPUT1", "simple", 64, 128);
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert_eq!(
            e.message,
            "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 128"
        );
        assert_eq!(
            raw_request_input_count("m", 3).message,
            "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in \
             'm' model configuration"
        );
        assert_eq!(
            raw_input_shape_ambiguous("INPUT0").message,
            "The shape of the raw input 'INPUT0' can not be deduced because there are more \
             than one variable-sized dimension"
        );
        assert_eq!(
            raw_bytes_input_shape("INPUT0").message,
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"
        );
    }

    #[test]
    fn long_names_are_clipped() {
        let long = "x".repeat(100_000);
        assert!(shm_unknown_region(&long).message.len() < 2_000);
    }
}
