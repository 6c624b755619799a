//! Generated protobuf types: Triton's `inference` package (service + model
//! config) and `grpc.health.v1`.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod inference {
    tonic::include_proto!("inference");
}

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod health {
    tonic::include_proto!("grpc.health.v1");
}

/// Serialized `FileDescriptorSet` of every proto in `proto/`, for prost-reflect.
pub const DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("shardserve_descriptor");
