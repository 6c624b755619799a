//! `grpc.health.v1.Health`: SERVING while the server is ready.

use crate::{
    frontend::env,
    proto::health::{
        health_check_response::ServingStatus, health_server::Health, HealthCheckRequest,
        HealthCheckResponse,
    },
};

/// Padded for the reason `InferenceService` is: tonic clones its `Arc`
/// (one per shard) on every call.
#[derive(Clone, Copy)]
#[repr(align(128))]
pub struct HealthService;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        _request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        let ready = env::with_current(|e| e.lifecycle.ready()).unwrap_or(false);
        let status = if ready {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        Ok(tonic::Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }
}
