//! `inference.GRPCInferenceService`. RPCs not listed here answer
//! UNIMPLEMENTED through the generated default methods; `ModelStreamInfer`
//! lives in `stream`.

use tonic::{codegen::BoxStream, Request, Response, Status, Streaming};

use super::{
    codec::{decode_model_infer_request_for, encode_model_infer_response, typed_contents_size},
    raw_tail::{RawTail, MIN_TAIL_BYTES},
    status::to_status,
    stream::{Inbound, InferStream},
    stream_answer::StreamAnswer,
};
use crate::{
    frontend::{
        core::{
            infer as core,
            metadata::{ModelMetadata, ServerMetadata},
        },
        env,
    },
    metrics::statistics,
    model::{metadata::TensorMetadata, ModelTable},
    offload,
    proto::inference::{
        grpc_inference_service_server::GrpcInferenceService, model_metadata_response,
        ModelConfigRequest, ModelConfigResponse, ModelInferRequest, ModelInferResponse,
        ModelMetadataRequest, ModelMetadataResponse, ModelReadyRequest, ModelReadyResponse,
        ModelStatisticsRequest, ModelStatisticsResponse, ModelStreamInferResponse,
        ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest, ServerMetadataResponse,
        ServerReadyRequest, ServerReadyResponse,
    },
    proto::inference::{
        CudaSharedMemoryRegisterRequest, CudaSharedMemoryRegisterResponse,
        CudaSharedMemoryStatusRequest, CudaSharedMemoryStatusResponse,
        CudaSharedMemoryUnregisterRequest, CudaSharedMemoryUnregisterResponse,
        SystemSharedMemoryRegisterRequest, SystemSharedMemoryRegisterResponse,
        SystemSharedMemoryStatusRequest, SystemSharedMemoryStatusResponse,
        SystemSharedMemoryUnregisterRequest, SystemSharedMemoryUnregisterResponse,
    },
    shard,
    trace::Event,
    types::{clip, InferError, InferRequest, InferResponse},
};

/// The longest model name a repository can hold: a model is a directory,
/// and Linux allows 255 bytes per path component. A longer name is
/// unknown without a lookup, and is never echoed whole.
const MAX_MODEL_NAME: usize = 255;

/// NOT_FOUND, in Triton's words, for a name no model can have.
fn check_name_length(name: &str) -> Result<(), Status> {
    check_model_name(name).map_err(to_status)
}

pub(super) fn check_model_name(name: &str) -> Result<(), InferError> {
    if name.len() <= MAX_MODEL_NAME {
        return Ok(());
    }
    Err(InferError::not_found(format!(
        "Request for unknown model: '{}' is not found",
        clip(name)
    )))
}

/// The model name a response may echo: whole when a model can have it,
/// else clipped, so a 10 MB name never comes back.
pub(super) fn echoed_model_name(name: &str) -> String {
    if name.len() <= MAX_MODEL_NAME {
        name.to_string()
    } else {
        clip(name).into_owned()
    }
}

/// Decodes a `ModelInferRequest` for the core infer path, as unary
/// `ModelInfer` and every message of `ModelStreamInfer` need it. Raw
/// contents move into tensors for free; only typed contents large enough
/// to matter are packed off the shard, after their shapes were checked
/// against the model. A small request is decoded in the future's first
/// poll.
pub(super) async fn decode_infer_request(
    msg: ModelInferRequest,
) -> Result<InferRequest, InferError> {
    check_model_name(&msg.model_name)?;
    if typed_contents_size(&msg) <= offload::BODY_THRESHOLD {
        return decode_model_infer_request_for(msg, None);
    }
    // The offload thread needs its own handle on the model: one `Arc`
    // clone per large typed request (the table itself is borrowed).
    let model = shard::with_current(|s| {
        s.with_table(|t| t.resolve(&msg.model_name, &msg.model_version).ok().cloned())
    })
    .ok_or_else(|| InferError::internal("gRPC call outside a shard"))?;
    offload::run(move || decode_model_infer_request_for(msg, model.as_deref().map(|m| &m.io)))
        .await?
}

/// Stateless; padded because tonic's server wraps it in an `Arc` (one per
/// shard) and clones that `Arc` on every call: the padding gives the count
/// a line of its own, away from anything another shard allocated.
#[derive(Clone, Copy)]
#[repr(align(128))]
pub struct InferenceService;

/// Runs `f` on the shard's model table, borrowed: the `Arc` is shared by
/// every shard, so cloning it per call would write a line other cores write.
fn with_table<R>(f: impl FnOnce(&ModelTable) -> R) -> Result<R, Status> {
    shard::with_current(|s| s.with_table(f))
        .ok_or_else(|| Status::internal("gRPC call outside a shard"))
}

/// `ServerMetadata` in its protobuf form.
fn server_metadata_response(v: ServerMetadata) -> ServerMetadataResponse {
    ServerMetadataResponse {
        name: v.name,
        version: v.version.into(),
        extensions: v.extensions.iter().map(|e| (*e).to_string()).collect(),
    }
}

/// `ModelMetadata` in its protobuf form.
fn model_metadata_response(v: &ModelMetadata<'_>) -> ModelMetadataResponse {
    ModelMetadataResponse {
        name: v.name.to_string(),
        versions: v.version_strings(),
        platform: v.platform.to_string(),
        inputs: tensors(v.inputs),
        outputs: tensors(v.outputs),
    }
}

fn tensors(list: &[TensorMetadata]) -> Vec<model_metadata_response::TensorMetadata> {
    list.iter()
        .map(|t| model_metadata_response::TensorMetadata {
            name: t.name.clone(),
            datatype: t.datatype.to_string(),
            shape: t.shape.clone(),
        })
        .collect()
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(
        &self,
        _: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        let live = env::with_current(|e| e.lifecycle.live()).unwrap_or(false);
        Ok(Response::new(ServerLiveResponse { live }))
    }

    async fn server_ready(
        &self,
        _: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        let ready = env::with_current(|e| e.lifecycle.ready()).unwrap_or(false);
        Ok(Response::new(ServerReadyResponse { ready }))
    }

    async fn model_ready(
        &self,
        req: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        let req = req.into_inner();
        // Triton answers ready=false for an unknown model rather than an error.
        let ready = req.name.len() <= MAX_MODEL_NAME
            && with_table(|t| t.resolve(&req.name, &req.version).is_ok())?;
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(server_metadata_response(
            ServerMetadata::current(),
        )))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let req = req.into_inner();
        check_name_length(&req.name)?;
        let response = with_table(|table| {
            let m = table.resolve(&req.name, &req.version).map_err(to_status)?;
            Ok::<_, Status>(model_metadata_response(&ModelMetadata::new(table, m)))
        })??;
        Ok(Response::new(response))
    }

    async fn model_config(
        &self,
        req: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let req = req.into_inner();
        check_name_length(&req.name)?;
        let config = with_table(|table| {
            let m = table.resolve(&req.name, &req.version).map_err(to_status)?;
            Ok::<_, Status>((*m.config).clone())
        })??;
        Ok(Response::new(ModelConfigResponse {
            config: Some(config),
        }))
    }

    async fn model_statistics(
        &self,
        req: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        let req = req.into_inner();
        check_name_length(&req.name)?;
        let model_stats =
            with_table(|t| statistics::collect(t, &req.name, &req.version))?.map_err(to_status)?;
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn model_infer(
        &self,
        req: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let (metadata, extensions, message) = req.into_parts();
        let answer = model_infer_call(&metadata, &extensions, InferMessage::Proto(message)).await?;
        let (encoded, tail) = sent(answer, |answer| {
            let mut encoded = encode_model_infer_response(answer);
            let tail = take_raw_tail(&mut encoded);
            (encoded, tail)
        });
        let mut response = Response::new(encoded);
        if let Some(tail) = tail {
            response.extensions_mut().insert(tail);
        }
        Ok(response)
    }

    async fn trace_setting(
        &self,
        req: Request<crate::proto::inference::TraceSettingRequest>,
    ) -> Result<Response<crate::proto::inference::TraceSettingResponse>, Status> {
        crate::frontend::trace_api::grpc(req.into_inner())
            .map(Response::new)
            .map_err(to_status)
    }

    async fn repository_index(
        &self,
        req: Request<crate::proto::inference::RepositoryIndexRequest>,
    ) -> Result<Response<crate::proto::inference::RepositoryIndexResponse>, Status> {
        super::repository_service::index(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn repository_model_load(
        &self,
        req: Request<crate::proto::inference::RepositoryModelLoadRequest>,
    ) -> Result<Response<crate::proto::inference::RepositoryModelLoadResponse>, Status> {
        super::repository_service::load(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn repository_model_unload(
        &self,
        req: Request<crate::proto::inference::RepositoryModelUnloadRequest>,
    ) -> Result<Response<crate::proto::inference::RepositoryModelUnloadResponse>, Status> {
        super::repository_service::unload(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn log_settings(
        &self,
        req: Request<crate::proto::inference::LogSettingsRequest>,
    ) -> Result<Response<crate::proto::inference::LogSettingsResponse>, Status> {
        crate::frontend::logging::grpc(req.into_inner())
            .map(Response::new)
            .map_err(to_status)
    }

    async fn system_shared_memory_status(
        &self,
        req: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        super::shm_service::system_status(req.into_inner()).map(Response::new)
    }

    async fn system_shared_memory_register(
        &self,
        req: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        super::shm_service::system_register(req.into_inner()).map(Response::new)
    }

    async fn system_shared_memory_unregister(
        &self,
        req: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        super::shm_service::system_unregister(req.into_inner()).map(Response::new)
    }

    async fn cuda_shared_memory_status(
        &self,
        req: Request<CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<CudaSharedMemoryStatusResponse>, Status> {
        super::shm_service::cuda_status(req.into_inner()).map(Response::new)
    }

    async fn cuda_shared_memory_register(
        &self,
        req: Request<CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<CudaSharedMemoryRegisterResponse>, Status> {
        super::shm_service::cuda_register(req.into_inner()).map(Response::new)
    }

    async fn cuda_shared_memory_unregister(
        &self,
        req: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<CudaSharedMemoryUnregisterResponse>, Status> {
        super::shm_service::cuda_unregister(req.into_inner()).map(Response::new)
    }

    async fn model_stream_infer(
        &self,
        req: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<BoxStream<ModelStreamInferResponse>>, Status> {
        let forwarded = forwarded_metadata(req.metadata());
        // Only reached where the router did not take the method itself
        // (`stream_route`, which reads the messages' bytes).
        let answers = InferStream::new(Inbound::Proto(req.into_inner()), forwarded);
        Ok(Response::new(Box::pin(futures::StreamExt::map(
            answers,
            |answer| answer.map(StreamAnswer::into_proto),
        ))))
    }
}

/// A `ModelInfer` message as a handler has it: prost's, or already the
/// request (`request_wire` read a plain message on the direct path).
pub(super) enum InferMessage {
    Proto(ModelInferRequest),
    Plain(InferRequest),
}

impl InferMessage {
    fn model_name(&self) -> &str {
        match self {
            Self::Proto(m) => &m.model_name,
            Self::Plain(r) => &r.model_name,
        }
    }
}

/// One `ModelInfer` call from its decoded message to its answer: the part
/// tonic's handler and the direct one (`unary_infer`) share. Each encodes
/// the answer its own way, inside [`sent`].
pub(super) async fn model_infer_call(
    metadata: &tonic::metadata::MetadataMap,
    extensions: &http::Extensions,
    message: InferMessage,
) -> Result<InferResponse, Status> {
    let mut trace = core::trace(message.model_name());
    if trace.is_traced() {
        if let Some(at) = extensions.get::<crate::trace::HeadersAt>() {
            trace.stamp_at(Event::GrpcWaitreadStart, at.0);
        }
        trace.stamp(Event::GrpcWaitreadEnd);
    }
    let forwarded = forwarded_metadata(metadata);
    let mut request = match message {
        InferMessage::Proto(m) => decode_infer_request(m).await.map_err(to_status)?,
        InferMessage::Plain(r) => r,
    };
    if let Some(forwarded) = forwarded {
        merge_forwarded(&mut request, forwarded).map_err(to_status)?;
    }
    request.trace = trace;
    core::infer(request, core::Protocol::Grpc)
        .await
        .map_err(to_status)
}

/// Encodes `answer` with `encode` between the trace's send stamps: the
/// send is the hand-over of the response to the gRPC library.
pub(super) fn sent<T>(mut answer: InferResponse, encode: impl FnOnce(InferResponse) -> T) -> T {
    let mut trace = answer.trace.take();
    trace.stamp(Event::GrpcSendStart);
    let out = encode(answer);
    trace.stamp(Event::GrpcSendEnd);
    out
}

/// `--grpc-header-forward-pattern`: the call's matching metadata as
/// request parameters, read once per call (a stream's requests share
/// them); `None` when the pattern is unset.
pub(super) fn forwarded_metadata(
    metadata: &tonic::metadata::MetadataMap,
) -> Option<Result<crate::types::Parameters, InferError>> {
    env::with_current(|e| {
        e.grpc_header_forward.get().map(|f| {
            let mut forwarded = crate::types::Parameters::new();
            f.apply_grpc(metadata, &mut forwarded).map(|()| forwarded)
        })
    })
    .flatten()
}

/// Sets the forwarded metadata over the request's own parameters (Triton
/// sets them last, so they win).
pub(super) fn merge_forwarded(
    request: &mut InferRequest,
    forwarded: Result<crate::types::Parameters, InferError>,
) -> Result<(), InferError> {
    request.parameters.extend(forwarded?);
    Ok(())
}

/// Takes large raw outputs out of the message tonic will encode, to be
/// sent from their own buffers after it (see `raw_tail`). Not where
/// tonic may compress the response, nor past the message size limit
/// (tonic's own check then refuses the whole message as before).
fn take_raw_tail(message: &mut ModelInferResponse) -> Option<RawTail> {
    let raw: usize = message.raw_output_contents.iter().map(|b| b.len()).sum();
    if raw < MIN_TAIL_BYTES {
        return None;
    }
    let (limit, compressing) = env::with_current(|e| {
        (
            e.limits.grpc_max_message_size,
            e.limits.grpc_compress_responses,
        )
    })
    .unwrap_or((64 << 20, true));
    if compressing || prost::Message::encoded_len(message) > limit {
        return None;
    }
    Some(RawTail(std::mem::take(&mut message.raw_output_contents)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn proto_tensors(list: &[model_metadata_response::TensorMetadata]) -> serde_json::Value {
        list.iter()
            .map(|t| json!({"name": t.name, "datatype": t.datatype, "shape": t.shape}))
            .collect()
    }

    /// The protobuf renderings carry exactly what the JSON ones (HTTP and
    /// the in-process API) carry.
    #[test]
    fn json_and_protobuf_renderings_agree() {
        let server = ServerMetadata {
            name: "custom".into(),
            version: crate::frontend::identity::VERSION,
            extensions: crate::frontend::identity::EXTENSIONS,
        };
        let proto = server_metadata_response(server.clone());
        assert_eq!(
            server.to_json(),
            json!({"name": proto.name, "version": proto.version, "extensions": proto.extensions})
        );

        let tensor = |name: &str, datatype, shape: Vec<i64>| TensorMetadata {
            name: name.into(),
            datatype,
            shape,
        };
        let inputs = [
            tensor("INPUT0", "INT32", vec![-1, 16]),
            tensor("IN1", "BYTES", vec![]),
        ];
        let outputs = [tensor("OUTPUT0", "FP32", vec![3])];
        let model = ModelMetadata {
            name: "simple",
            versions: vec![1, 3],
            platform: "onnxruntime_onnx",
            inputs: &inputs,
            outputs: &outputs,
        };
        let proto = model_metadata_response(&model);
        assert_eq!(
            model.to_json(),
            json!({
                "name": proto.name,
                "versions": proto.versions,
                "platform": proto.platform,
                "inputs": proto_tensors(&proto.inputs),
                "outputs": proto_tensors(&proto.outputs),
            })
        );
        assert_eq!(proto.versions, ["1", "3"]);
    }
}
