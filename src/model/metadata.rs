//! Model metadata (KServe `GET /v2/models/{m}` and gRPC ModelMetadata),
//! precomputed per version at load time.

use super::IoSpec;

#[derive(Debug, Clone)]
pub struct TensorMetadata {
    pub name: String,
    pub datatype: &'static str,
    pub shape: Vec<i64>,
}

#[derive(Debug, Clone)]
pub struct ModelMetadata {
    pub name: String,
    pub platform: String,
    pub inputs: Vec<TensorMetadata>,
    pub outputs: Vec<TensorMetadata>,
}

impl ModelMetadata {
    pub fn new(name: &str, platform: &str, io: &IoSpec) -> Self {
        Self {
            name: name.to_string(),
            platform: platform.to_string(),
            inputs: io
                .inputs
                .iter()
                .map(|i| TensorMetadata {
                    name: i.name.clone(),
                    datatype: i.datatype.as_str(),
                    shape: io.client_shape(&i.dims),
                })
                .collect(),
            outputs: io
                .outputs
                .iter()
                .map(|o| TensorMetadata {
                    name: o.name.clone(),
                    datatype: o.datatype.as_str(),
                    shape: io.client_shape(&o.dims),
                })
                .collect(),
        }
    }
}
