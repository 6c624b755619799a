use crate::proto::inference::DataType as ConfigDataType;

/// A tensor element type, as named by KServe v2 (`"INT32"`) and by Triton's
/// model configuration (`TYPE_INT32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bf16,
    /// Variable-length byte strings (`TYPE_STRING` in model configs).
    Bytes,
}

impl DataType {
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bf16,
        DataType::Bytes,
    ];

    /// The KServe v2 wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bf16 => "BF16",
            DataType::Bytes => "BYTES",
        }
    }

    /// Parses a KServe v2 wire name (`"INT32"`).
    pub fn from_wire(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == name)
    }

    /// Size of one element in bytes; `None` for variable-length `BYTES`.
    pub fn element_size(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }

    /// Converts a model-config data type (`TYPE_INT32`); `None` for `TYPE_INVALID`.
    pub fn from_config(dt: ConfigDataType) -> Option<Self> {
        Some(match dt {
            ConfigDataType::TypeInvalid => return None,
            ConfigDataType::TypeBool => DataType::Bool,
            ConfigDataType::TypeUint8 => DataType::Uint8,
            ConfigDataType::TypeUint16 => DataType::Uint16,
            ConfigDataType::TypeUint32 => DataType::Uint32,
            ConfigDataType::TypeUint64 => DataType::Uint64,
            ConfigDataType::TypeInt8 => DataType::Int8,
            ConfigDataType::TypeInt16 => DataType::Int16,
            ConfigDataType::TypeInt32 => DataType::Int32,
            ConfigDataType::TypeInt64 => DataType::Int64,
            ConfigDataType::TypeFp16 => DataType::Fp16,
            ConfigDataType::TypeFp32 => DataType::Fp32,
            ConfigDataType::TypeFp64 => DataType::Fp64,
            ConfigDataType::TypeString => DataType::Bytes,
            ConfigDataType::TypeBf16 => DataType::Bf16,
        })
    }

    /// Converts the raw `i32` stored in prost config structs.
    pub fn from_config_i32(dt: i32) -> Option<Self> {
        ConfigDataType::try_from(dt)
            .ok()
            .and_then(Self::from_config)
    }

    pub fn to_config(self) -> ConfigDataType {
        match self {
            DataType::Bool => ConfigDataType::TypeBool,
            DataType::Uint8 => ConfigDataType::TypeUint8,
            DataType::Uint16 => ConfigDataType::TypeUint16,
            DataType::Uint32 => ConfigDataType::TypeUint32,
            DataType::Uint64 => ConfigDataType::TypeUint64,
            DataType::Int8 => ConfigDataType::TypeInt8,
            DataType::Int16 => ConfigDataType::TypeInt16,
            DataType::Int32 => ConfigDataType::TypeInt32,
            DataType::Int64 => ConfigDataType::TypeInt64,
            DataType::Fp16 => ConfigDataType::TypeFp16,
            DataType::Fp32 => ConfigDataType::TypeFp32,
            DataType::Fp64 => ConfigDataType::TypeFp64,
            DataType::Bytes => ConfigDataType::TypeString,
            DataType::Bf16 => ConfigDataType::TypeBf16,
        }
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_and_config_names_round_trip() {
        for dt in DataType::ALL {
            assert_eq!(DataType::from_wire(dt.as_str()), Some(dt));
            assert_eq!(DataType::from_config(dt.to_config()), Some(dt));
        }
        assert_eq!(DataType::from_wire("int32"), None);
        assert_eq!(DataType::from_config(ConfigDataType::TypeInvalid), None);
    }
}
