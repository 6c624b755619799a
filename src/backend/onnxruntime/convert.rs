//! Conversions between our [`Tensor`] (Triton's raw little-endian layout)
//! and ONNX Runtime values.
//!
//! Inputs are handed to ORT as views of the request's bytes when the bytes
//! are suitably aligned (the common case for buffers we allocated) and
//! copied otherwise; outputs stay in ORT's buffer, which the returned
//! `Bytes` owns, so a large output is never copied here.

use std::{fmt::Debug, mem::size_of, ptr};

use bytes::Bytes;
use ort::{
    memory::Allocator,
    session::SessionInputValue,
    value::{
        DynTensor, DynTensorValueType, DynValue, PrimitiveTensorElementType, Tensor as OrtTensor,
        TensorElementType, TensorRef,
    },
    AsPointer,
};

use crate::types::{bytes_elements, element_count, DataType, Tensor};

// Both our layout and ORT's native memory are read as plain bytes below.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "the ONNX Runtime backend assumes a little-endian target"
);

/// The ORT element type for a KServe datatype (every KServe type has one).
pub fn ort_type(dt: DataType) -> TensorElementType {
    match dt {
        DataType::Bool => TensorElementType::Bool,
        DataType::Uint8 => TensorElementType::Uint8,
        DataType::Uint16 => TensorElementType::Uint16,
        DataType::Uint32 => TensorElementType::Uint32,
        DataType::Uint64 => TensorElementType::Uint64,
        DataType::Int8 => TensorElementType::Int8,
        DataType::Int16 => TensorElementType::Int16,
        DataType::Int32 => TensorElementType::Int32,
        DataType::Int64 => TensorElementType::Int64,
        DataType::Fp16 => TensorElementType::Float16,
        DataType::Fp32 => TensorElementType::Float32,
        DataType::Fp64 => TensorElementType::Float64,
        DataType::Bf16 => TensorElementType::Bfloat16,
        DataType::Bytes => TensorElementType::String,
    }
}

/// The KServe datatype for an ORT element type; `None` for types KServe
/// cannot carry (complex, 8-bit and 4-bit floats, 2/4-bit integers).
pub fn kserve_type(ty: TensorElementType) -> Option<DataType> {
    Some(match ty {
        TensorElementType::Bool => DataType::Bool,
        TensorElementType::Uint8 => DataType::Uint8,
        TensorElementType::Uint16 => DataType::Uint16,
        TensorElementType::Uint32 => DataType::Uint32,
        TensorElementType::Uint64 => DataType::Uint64,
        TensorElementType::Int8 => DataType::Int8,
        TensorElementType::Int16 => DataType::Int16,
        TensorElementType::Int32 => DataType::Int32,
        TensorElementType::Int64 => DataType::Int64,
        TensorElementType::Float16 => DataType::Fp16,
        TensorElementType::Float32 => DataType::Fp32,
        TensorElementType::Float64 => DataType::Fp64,
        TensorElementType::Bfloat16 => DataType::Bf16,
        TensorElementType::String => DataType::Bytes,
        _ => return None,
    })
}

/// Integer and float element types: every bit pattern is a valid value,
/// which is what makes viewing request bytes as `&[Self]` sound.
///
/// # Safety
/// Implement only for types without padding or invalid bit patterns.
unsafe trait Plain: PrimitiveTensorElementType + Debug + Copy + Clone + 'static {
    fn from_le(bytes: &[u8]) -> Self;
}

macro_rules! plain {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive integer or float; all bit patterns are valid.
        unsafe impl Plain for $t {
            fn from_le(bytes: &[u8]) -> Self {
                let mut raw = [0u8; size_of::<$t>()];
                raw.copy_from_slice(bytes);
                <$t>::from_le_bytes(raw)
            }
        }
    )*};
}
plain!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64);

/// Converts one input. Errors are about the data (the caller reports them
/// as invalid arguments); ORT failures come back as text too.
pub fn to_ort(t: &Tensor) -> Result<SessionInputValue<'_>, String> {
    let shape = t.shape.clone();
    let count = element_count(&shape).ok_or_else(|| format!("invalid shape {shape:?}"))?;
    if let Some(size) = t.datatype.element_size() {
        if count.checked_mul(size) != Some(t.data.len()) {
            return Err(format!(
                "{} bytes of data do not hold shape {shape:?} of {}",
                t.data.len(),
                t.datatype
            ));
        }
    }
    let data: &[u8] = &t.data;
    let value = match t.datatype {
        DataType::Int8 => plain::<i8>(shape, data),
        DataType::Int16 => plain::<i16>(shape, data),
        DataType::Int32 => plain::<i32>(shape, data),
        DataType::Int64 => plain::<i64>(shape, data),
        DataType::Uint8 => plain::<u8>(shape, data),
        DataType::Uint16 => plain::<u16>(shape, data),
        DataType::Uint32 => plain::<u32>(shape, data),
        DataType::Uint64 => plain::<u64>(shape, data),
        DataType::Fp32 => plain::<f32>(shape, data),
        DataType::Fp64 => plain::<f64>(shape, data),
        // ort has no Rust element type for these without its `half`
        // feature, and a bool byte other than 0/1 must not reach C++ as a
        // `bool`: both go through an ORT-allocated copy.
        DataType::Fp16 | DataType::Bf16 | DataType::Bool => copied(t.datatype, shape, data),
        DataType::Bytes => strings(shape, count, data),
    };
    value.map_err(|e| e.to_string())
}

fn plain<T: Plain>(shape: Vec<i64>, data: &[u8]) -> Result<SessionInputValue<'_>, ConvertError> {
    // SAFETY: `T: Plain` has no invalid bit patterns and `data` is
    // initialised, so any aligned middle part is a valid `[T]`.
    let (head, body, tail) = unsafe { data.align_to::<T>() };
    if head.is_empty() && tail.is_empty() {
        return Ok(TensorRef::from_array_view((shape, body))?.into());
    }
    // Unaligned: a slice of a larger network buffer at an odd offset.
    let owned: Vec<T> = data.chunks_exact(size_of::<T>()).map(T::from_le).collect();
    Ok(OrtTensor::from_array((shape, owned))?.into())
}

fn copied(
    dt: DataType,
    shape: Vec<i64>,
    data: &[u8],
) -> Result<SessionInputValue<'static>, ConvertError> {
    let mut tensor = DynTensor::new(&Allocator::default(), ort_type(dt), shape)?;
    let len = tensor.size().unwrap_or(0);
    if len != data.len() {
        return Err(ConvertError::Text(format!(
            "ONNX Runtime allocated {len} bytes for {} bytes of {dt}",
            data.len()
        )));
    }
    if len > 0 {
        let dst = tensor.data_ptr_mut().cast::<u8>();
        if dst.is_null() {
            return Err(ConvertError::Text(
                "ONNX Runtime allocated no buffer".into(),
            ));
        }
        // SAFETY: `dst` is the CPU buffer ORT allocated for this tensor,
        // `len` bytes long (checked above), and not aliased by `data`.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, len) };
        if dt == DataType::Bool {
            for (d, s) in dst.iter_mut().zip(data) {
                *d = u8::from(*s != 0);
            }
        } else {
            dst.copy_from_slice(data);
        }
    }
    Ok(tensor.into())
}

/// BYTES → ONNX string tensor. ORT's `FillStringTensor` takes C strings,
/// which would cut elements at a NUL; writing each element into a buffer
/// of its exact length keeps arbitrary bytes intact.
fn strings(
    shape: Vec<i64>,
    count: usize,
    data: &[u8],
) -> Result<SessionInputValue<'static>, ConvertError> {
    let found = bytes_elements(data).map_err(ConvertError::Text)?.count();
    if found != count {
        return Err(ConvertError::Text(format!(
            "{found} BYTES elements do not fill shape {shape:?}"
        )));
    }
    let mut tensor = DynTensor::new(&Allocator::default(), TensorElementType::String, shape)?;
    let value = tensor.ptr_mut();
    for (index, element) in bytes_elements(data)
        .map_err(ConvertError::Text)?
        .enumerate()
    {
        let mut buf: *mut std::ffi::c_char = ptr::null_mut();
        // SAFETY: `value` is a live string tensor of `count` elements and
        // `index < count`; ORT returns a buffer of exactly `element.len()`
        // bytes, which we fill completely.
        unsafe {
            let status = (ort::api().GetResizedStringTensorElementBuffer)(
                value,
                index,
                element.len(),
                &mut buf,
            );
            ort::Error::result_from_status(status)?;
            if !element.is_empty() {
                if buf.is_null() {
                    return Err(ConvertError::Text(
                        "ONNX Runtime gave no string buffer".into(),
                    ));
                }
                ptr::copy_nonoverlapping(element.as_ptr(), buf.cast::<u8>(), element.len());
            }
        }
    }
    Ok(tensor.into())
}

/// Converts one output, taking ownership of ORT's buffer (no copy) for
/// fixed-size types.
pub fn from_ort(name: &str, value: DynValue) -> Result<Tensor, String> {
    let tensor = value
        .downcast::<DynTensorValueType>()
        .map_err(|_| format!("output '{name}' is not a tensor"))?;
    let ty = *tensor.data_type();
    let datatype = kserve_type(ty).ok_or_else(|| {
        format!("output '{name}' has element type {ty}, which KServe cannot carry")
    })?;
    let shape: Vec<i64> = tensor.shape().iter().copied().collect();
    let data = if datatype == DataType::Bytes {
        read_strings(&tensor).map_err(|e| format!("output '{name}': {e}"))?
    } else {
        let len = ty
            .byte_size(tensor.shape().num_elements())
            .ok_or_else(|| format!("output '{name}' has no fixed element size"))?;
        if !tensor.memory_info().is_cpu_accessible() {
            return Err(format!("output '{name}' is not in CPU memory"));
        }
        if len == 0 {
            Bytes::new()
        } else {
            Bytes::from_owner(OrtBuffer { tensor, len })
        }
    };
    Ok(Tensor::new(name, datatype, shape, data))
}

/// An ORT output tensor viewed as its bytes; dropping it releases the value.
struct OrtBuffer {
    tensor: DynTensor,
    len: usize,
}

impl AsRef<[u8]> for OrtBuffer {
    fn as_ref(&self) -> &[u8] {
        let data = self.tensor.data_ptr().cast::<u8>();
        if data.is_null() {
            return &[];
        }
        // SAFETY: a CPU tensor of `len` bytes (checked when built) that
        // lives as long as `self`; nothing writes to it once ORT returned it.
        unsafe { std::slice::from_raw_parts(data, self.len) }
    }
}

fn read_strings(tensor: &DynTensor) -> Result<Bytes, ConvertError> {
    let count = tensor.shape().num_elements();
    if count == 0 {
        return Ok(Bytes::new());
    }
    let api = ort::api();
    let value = tensor.ptr();
    let mut total = 0usize;
    // SAFETY: `value` is a live string tensor; each call writes only into
    // the buffers we size from ORT's own answers.
    let (content, offsets) = unsafe {
        ort::Error::result_from_status((api.GetStringTensorDataLength)(value, &mut total))?;
        let mut content = vec![0u8; total];
        let mut offsets = vec![0usize; count];
        ort::Error::result_from_status((api.GetStringTensorContent)(
            value,
            content.as_mut_ptr().cast(),
            total,
            offsets.as_mut_ptr(),
            count,
        ))?;
        (content, offsets)
    };
    let mut out = Vec::with_capacity(total + 4 * count);
    for (i, &start) in offsets.iter().enumerate() {
        let end = offsets.get(i + 1).copied().unwrap_or(total);
        let element = content.get(start..end).ok_or_else(|| {
            ConvertError::Text(format!("string element {i} lies outside ORT's buffer"))
        })?;
        let len = u32::try_from(element.len())
            .map_err(|_| ConvertError::Text(format!("string element {i} is longer than 4 GiB")))?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(element);
    }
    Ok(Bytes::from(out))
}

#[derive(Debug, thiserror::Error)]
enum ConvertError {
    #[error("{0}")]
    Ort(#[from] ort::Error),
    #[error("{0}")]
    Text(String),
}
