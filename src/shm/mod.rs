//! Triton's system shared memory extension: clients register POSIX shm
//! regions (`/v2/systemsharedmemory`, gRPC `SystemSharedMemory*`), then
//! name them in inference requests through the tensor parameters
//! `shared_memory_region`, `shared_memory_offset` and
//! `shared_memory_byte_size`.
//!
//! - An input read from a region is a `Bytes` that owns an `Arc` of the
//!   region: no copy, and the mapping outlives an unregister that races
//!   the request.
//! - An output requested into a region is copied there once after the
//!   model ran (the backends write into their own buffers), and the
//!   response carries the output's datatype and shape without its data.
//!
//! - A client that truncates a region's shm object while it is mapped
//!   makes the request that uses it fail naming the region, never the
//!   server crash: `fault` absorbs the SIGBUS such an access raises on
//!   any thread, and `RequestRegions` checks each region the request read
//!   or wrote once the model has run (`SystemRegion::check`).
//!
//! CUDA shared memory (`cuda`) shares the tensor parameters and the name
//! space: `registry` holds both kinds in one map under one lock, so a
//! request's region name is one lookup, and a name is taken by either
//! kind. CUDA inputs are copied to host memory and CUDA outputs to the
//! device (see `cuda.rs`). `system`, `mapping` and `fault` hold the system
//! mechanics.

pub mod cuda;
mod fault;
mod mapping;
pub mod registry;
mod system;

use std::sync::Arc;

use bytes::Bytes;

pub use cuda::CudaRegion;
pub use registry::{global, Kind, Lease, Region, Registry};
pub use system::SystemRegion;

use crate::{
    error_texts,
    types::{
        bytes_elements, clip, show_shape, DataType, InferError, InferResponse, ParamValue,
        Parameters, RequestedOutput, Tensor,
    },
};

/// Tensor parameter naming the region.
pub const REGION: &str = "shared_memory_region";
/// Tensor parameter: offset of the tensor inside the region.
pub const OFFSET: &str = "shared_memory_offset";
/// Tensor parameter: bytes of the region the tensor may use.
pub const BYTE_SIZE: &str = "shared_memory_byte_size";

/// Where a tensor lives, as a request's parameters say.
#[derive(Debug, Clone, PartialEq)]
pub struct ShmRef {
    pub region: String,
    pub offset: u64,
    /// `None` when the request did not say (inputs: 0, outputs: the rest
    /// of the region).
    pub byte_size: Option<u64>,
}

fn non_negative(v: &ParamValue) -> Option<u64> {
    match v {
        ParamValue::Int(n) => u64::try_from(*n).ok(),
        ParamValue::Uint(n) => Some(*n),
        _ => None,
    }
}

/// The shared memory reference in a tensor's parameters, if any. `what`
/// names the tensor in errors ("input 'X' for model 'M'").
pub fn shm_ref(params: &Parameters, what: &str) -> Result<Option<ShmRef>, InferError> {
    let Some(region) = params.get(REGION) else {
        return Ok(None);
    };
    let ParamValue::String(region) = region else {
        return Err(InferError::invalid(format!(
            "{what}: Unable to parse '{REGION}': it must be a string"
        )));
    };
    let number = |key: &str| -> Result<Option<u64>, InferError> {
        params
            .get(key)
            .map(|v| {
                non_negative(v).ok_or_else(|| {
                    InferError::invalid(format!(
                        "{what}: Unable to parse '{key}': it must be a non-negative integer"
                    ))
                })
            })
            .transpose()
    };
    Ok(Some(ShmRef {
        region: region.clone(),
        offset: number(OFFSET)?.unwrap_or(0),
        byte_size: number(BYTE_SIZE)?,
    }))
}

/// The region `name`, of either kind, or Triton's error for an unknown one.
fn find(name: &str) -> Result<Region, InferError> {
    global()
        .find(name)?
        .ok_or_else(|| error_texts::shm_unknown_region(name))
}

/// A tensor's bytes inside a region; keeps the region mapped.
struct RegionSlice {
    region: Arc<SystemRegion>,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for RegionSlice {
    fn as_ref(&self) -> &[u8] {
        // In bounds: checked by `bounds` when the slice was made.
        self.region
            .mapping
            .slice(self.offset, self.len)
            .unwrap_or_default()
    }
}

/// Reads input `input` of `model`, of `datatype` with `count` elements
/// (its shape), from the region `r` names, checking that the bytes agree
/// with the shape.
pub fn read_input(
    r: &ShmRef,
    datatype: DataType,
    count: usize,
    shape: &[i64],
    input: &str,
    model: &str,
) -> Result<Bytes, InferError> {
    let region = find(&r.region)?;
    let (offset, len) = region.bounds(r.offset, r.byte_size.unwrap_or(0))?;
    let (data, system) = match region {
        Region::System(region) => {
            // No system call before the model runs: a region truncated
            // by now is caught by `finish` (one `fstat` per region).
            region.check_known()?;
            let data = Bytes::from_owner(RegionSlice {
                region: Arc::clone(&region),
                offset,
                len,
            });
            (data, Some(region))
        }
        Region::Cuda(region) => (region.read(offset, len)?, None),
    };
    let checked = check_input(&data, datatype, count, shape, input, model);
    // BYTES are parsed here, which reads the region: a truncation that
    // faulted meanwhile, or one within the last page (zeros, no fault),
    // would otherwise surface as malformed data.
    if let Some(region) = system {
        if checked.is_err() {
            region.check()?;
        } else {
            region.check_known()?;
        }
    }
    checked.map(|()| data)
}

/// Checks that `data` holds `count` elements of `datatype`.
fn check_input(
    data: &[u8],
    datatype: DataType,
    count: usize,
    shape: &[i64],
    input: &str,
    model: &str,
) -> Result<(), InferError> {
    let len = data.len();
    let what = format!("input '{}' for model '{}'", clip(input), clip(model));
    match datatype.element_size() {
        Some(elem) => {
            let expected = count.checked_mul(elem);
            if expected != Some(len) {
                // Triton's text; a size past u64 cannot be addressed anyway.
                let expected = expected.map_or(u64::MAX, |n| n as u64);
                return Err(crate::error_texts::input_byte_size_mismatch(
                    input, model, expected, len as u64,
                ));
            }
        }
        None => {
            let n = bytes_elements(data)
                .map_err(|e| {
                    InferError::invalid(format!(
                        "{what}: malformed BYTES data in shared memory: {e}"
                    ))
                })?
                .count();
            if n != count {
                return Err(InferError::invalid(format!(
                    "{what}: BYTES data in shared memory holds {n} elements, but shape {} declares {count}",
                    show_shape(shape)
                )));
            }
        }
    }
    Ok(())
}

/// True when a requested output's parameters name a region to write it in.
pub fn names_region(output_parameters: &Parameters) -> bool {
    output_parameters.contains_key(REGION)
}

/// One output to be written into a region.
#[derive(Debug)]
struct OutputTarget {
    output: String,
    region: Region,
    offset: usize,
    len: usize,
}

/// The regions a request uses: those its inputs were read from, to be
/// checked for truncation once the model has run, and those its outputs go
/// to, resolved before the model runs (an unknown or truncated region fails
/// the request without running it, and the `Arc`s keep the regions mapped
/// until the outputs are written). Its leases defer an unregister of any
/// of them until it is dropped, which the front end does before the
/// answer goes out.
#[derive(Debug)]
pub struct RequestRegions {
    inputs: Vec<Arc<SystemRegion>>,
    outputs: Vec<OutputTarget>,
    _leases: Vec<Lease>,
}

/// The response to a request that used `regions`, once its outputs are
/// written there and every region it used is checked: a region truncated
/// meanwhile fails the request naming it, whatever the model answered.
pub fn finish(
    regions: Option<&RequestRegions>,
    result: Result<InferResponse, InferError>,
) -> Result<InferResponse, InferError> {
    let Some(regions) = regions else {
        return result;
    };
    let mut response = result.map_err(|e| regions.blame(e))?;
    regions.write(&mut response).map_err(|e| regions.blame(e))?;
    regions.check()?;
    Ok(response)
}

impl RequestRegions {
    /// `None` when no input was read from a system region and no requested
    /// output names a region (no allocation).
    pub fn resolve(
        inputs: &[Tensor],
        requested: &[RequestedOutput],
        model: &str,
    ) -> Result<Option<Self>, InferError> {
        let mut regions = Vec::<Arc<SystemRegion>>::new();
        for t in inputs {
            if let Some(r) = global().containing(t.data.as_ptr())? {
                if !regions.iter().any(|known| Arc::ptr_eq(known, &r)) {
                    regions.push(r);
                }
            }
        }
        if regions.is_empty() && !requested.iter().any(|r| r.parameters.contains_key(REGION)) {
            return Ok(None);
        }
        let mut targets = Vec::new();
        for r in requested {
            let what = format!("output '{}' for model '{}'", clip(&r.name), clip(model));
            let Some(shm) = shm_ref(&r.parameters, &what)? else {
                continue;
            };
            // Triton's texts: classification results are not stored in
            // shared memory, and binary data goes in the body.
            if r.class_count().is_some() {
                return Err(InferError::invalid(
                    "Output can't set both 'shared_memory_region' and 'classification'",
                ));
            }
            if matches!(
                r.parameters.get("binary_data"),
                Some(ParamValue::Bool(true))
            ) {
                return Err(InferError::invalid(
                    "Output can't set both 'shared_memory_region' and 'binary_data'",
                ));
            }
            let region = find(&shm.region)?;
            if let Region::System(r) = &region {
                r.check_known()?;
            }
            let byte_size = shm
                .byte_size
                .unwrap_or_else(|| region.byte_size().saturating_sub(shm.offset));
            let (offset, len) = region.bounds(shm.offset, byte_size)?;
            targets.push(OutputTarget {
                output: r.name.clone(),
                region,
                offset,
                len,
            });
        }
        let mut leased: Vec<Region> = regions.iter().cloned().map(Region::System).collect();
        for t in &targets {
            if !leased.iter().any(|r| r.same(&t.region)) {
                leased.push(t.region.clone());
            }
        }
        Ok(Some(Self {
            inputs: regions,
            outputs: targets,
            _leases: leased.into_iter().map(Lease::new).collect(),
        }))
    }

    /// Fails naming the first region used that was truncated; one `fstat`
    /// per region.
    pub fn check(&self) -> Result<(), InferError> {
        let all = || {
            self.inputs
                .iter()
                .chain(self.outputs.iter().filter_map(|t| match &t.region {
                    Region::System(r) => Some(r),
                    Region::Cuda(_) => None,
                }))
        };
        for (i, r) in all().enumerate() {
            if !all().take(i).any(|seen| Arc::ptr_eq(seen, r)) {
                r.check()?;
            }
        }
        Ok(())
    }

    /// A failure of the request, or the truncated region behind it: a
    /// model fed zero pages, or a write that faulted, fails because of it.
    pub fn blame(&self, error: InferError) -> InferError {
        self.check().err().unwrap_or(error)
    }

    /// Copies each target output into its region and leaves the response's
    /// tensor without data (the protocols then send datatype and shape
    /// only, as Triton does).
    pub fn write(&self, response: &mut InferResponse) -> Result<(), InferError> {
        for t in &self.outputs {
            let Some(tensor) = response.outputs.iter_mut().find(|o| o.name == t.output) else {
                continue;
            };
            let written = tensor.data.len() <= t.len
                && match &t.region {
                    Region::System(r) => r.mapping.write(t.offset, &tensor.data),
                    Region::Cuda(r) => {
                        r.write(t.offset, &tensor.data)?;
                        true
                    }
                };
            if !written {
                // Triton's text (INTERNAL, as its allocator reports it).
                return Err(InferError::internal(format!(
                    "shared memory size specified with the request for output '{}' ({} bytes) \
                     should be at least {} bytes to hold the results",
                    clip(&t.output),
                    t.len,
                    tensor.data.len()
                )));
            }
            tensor.data = Bytes::new();
        }
        Ok(())
    }
}
