//! `TRITONSERVER_ServerInferAsync`: a backend's request to another model of
//! this server, from any thread (the Python backend calls it from its own
//! threads for BLS).
//!
//! Path: the request is converted on the calling thread and handed to the
//! front ends' shared infer path (`frontend::core::infer::ThreadEntry`),
//! which checks it there (errors found are returned, and the caller keeps
//! its request, as in Triton) and queues it, bounded, for the shard that
//! owns the model's scheduler, where it runs exactly what a network request
//! runs (`core::infer::infer_stream`). Every response it yields is handed
//! to one `capi-callbacks` thread, which builds the C response (the
//! caller's allocator is C code and may block, so it never runs on a
//! shard), calls the response callback, and after the final one the
//! request's release callback.

use std::{
    ffi::c_void,
    future::poll_fn,
    pin::pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc, OnceLock,
    },
    task::Poll,
};

use futures::{
    future::{select, Either},
    StreamExt,
};

use super::{
    request::{Cancel, RequestReleaseFn, ResponseCallback, TRITONSERVER_InferenceRequest},
    response::TRITONSERVER_InferenceResponse,
    server::TRITONSERVER_Server,
};
use crate::triton_abi::{
    error::{invalid_arg, ErrorPtr, TRITONSERVER_Error},
    types::{error_kind_to_code, ERROR_UNAVAILABLE, REQUEST_RELEASE_ALL, RESPONSE_COMPLETE_FINAL},
};
use crate::{
    frontend::core::infer::{LocalTask, Refused},
    scheduler::{ResponseStream, Streamed},
    types::{InferError, InferResponse},
};

/// The caller's side of one request in flight: its callbacks and its
/// request object, which stays the caller's (and alive) until released.
struct Delivery {
    request: *mut TRITONSERVER_InferenceRequest,
    release: Option<(RequestReleaseFn, *mut c_void)>,
    response: ResponseCallback,
    model_name: String,
    model_version: String,
    id: String,
}

// SAFETY: the pointers are the caller's, valid until the release callback
// (the API's contract); they are only used on the callback thread, and the
// struct is never written after creation (shared only for reading).
unsafe impl Send for Delivery {}
// SAFETY: as for `Send` above: shared only for reading, on the callback thread.
unsafe impl Sync for Delivery {}

enum Event {
    Response(InferResponse, bool),
    Failed(InferError),
    /// A decoupled request's final flag, without a response.
    Final,
}

struct Callback {
    delivery: Arc<Delivery>,
    event: Event,
}

fn callback_thread() -> Option<&'static mpsc::Sender<Callback>> {
    static TX: OnceLock<Option<mpsc::Sender<Callback>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Callback>();
        match std::thread::Builder::new()
            .name("capi-callbacks".into())
            .spawn(move || {
                while let Ok(cb) = rx.recv() {
                    // SAFETY: see `Delivery`.
                    unsafe { deliver(cb) };
                }
            }) {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the C API callback thread");
                None
            }
        }
    })
    .as_ref()
}

unsafe fn deliver(cb: Callback) {
    let d = &cb.delivery;
    let (response, flags) = match cb.event {
        Event::Response(r, last) => (
            // SAFETY: the allocator named by the request is alive while the request is in flight
            // (tritonserver.h), which it is until the release callback below.
            Box::into_raw(unsafe { TRITONSERVER_InferenceResponse::build(r, &d.response) }),
            if last { RESPONSE_COMPLETE_FINAL } else { 0 },
        ),
        Event::Failed(e) => (
            Box::into_raw(TRITONSERVER_InferenceResponse::failed(
                &d.model_name,
                &d.model_version,
                &d.id,
                &e,
            )),
            RESPONSE_COMPLETE_FINAL,
        ),
        Event::Final => (std::ptr::null_mut(), RESPONSE_COMPLETE_FINAL),
    };
    // SAFETY: the caller's response callback with its own userp, called as tritonserver.h
    // specifies; the response (or null with the final flag) becomes the caller's.
    unsafe { (d.response.response_fn)(response, flags, d.response.response_userp) };
    if flags & RESPONSE_COMPLETE_FINAL != 0 {
        if let Some((release, userp)) = d.release {
            // SAFETY: the caller's release callback, called once after the final response with the
            // request it registered it on, which is still alive (it is the caller's until
            // released).
            unsafe { release(d.request, REQUEST_RELEASE_ALL, userp) };
        }
    }
}

/// Sends a request's events to the callback thread; if it is dropped
/// before the final one (the shard stopped), the caller still gets a final
/// error, so nobody waits forever.
struct Pending {
    delivery: Option<Arc<Delivery>>,
    /// Set when `ServerInferAsync` returned an error instead.
    refused: Arc<AtomicBool>,
}

impl Pending {
    fn send(&mut self, event: Event) {
        let last = !matches!(event, Event::Response(_, false));
        let delivery = if last {
            self.delivery.take()
        } else {
            self.delivery.clone()
        };
        let (Some(delivery), Some(tx)) = (delivery, callback_thread()) else {
            return;
        };
        let _ = tx.send(Callback { delivery, event });
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.delivery.is_some() && !self.refused.load(Ordering::Acquire) {
            self.send(Event::Failed(InferError::unavailable(
                "the server stopped before answering the request",
            )));
        }
    }
}

/// The shard side: pass every response of the request's stream on, until
/// the final one or the caller's cancellation.
async fn run(mut stream: ResponseStream, cancel: Arc<Cancel>, mut pending: Pending) {
    let mut cancelled = pin!(poll_fn(|cx| {
        cancel.waker.register(cx.waker());
        if cancel.is_cancelled() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }));
    loop {
        let next = match select(stream.next(), cancelled.as_mut()).await {
            Either::Left((item, _)) => item,
            Either::Right(((), _)) => {
                // Dropping the stream cancels the queued work.
                pending.send(Event::Failed(InferError::unavailable(
                    "the request was cancelled",
                )));
                return;
            }
        };
        match next {
            Some(Ok(Streamed::Response { response, last })) => {
                pending.send(Event::Response(response, last));
                if last {
                    return;
                }
            }
            Some(Ok(Streamed::Final(_))) => {
                pending.send(Event::Final);
                return;
            }
            Some(Err(e)) => {
                pending.send(Event::Failed(e));
                return;
            }
            None => {
                pending.send(Event::Failed(InferError::internal(
                    "the model's response stream ended without a final response",
                )));
                return;
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerInferAsync(
    server: *mut TRITONSERVER_Server,
    inference_request: *mut TRITONSERVER_InferenceRequest,
    _trace: *mut c_void,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `server` is null (refused by `from_c`) or the server `TRITONBACKEND_ModelServer`
        // handed out, which a backend may use while its model lives; `from_c` takes a reference of
        // its own.
        let server = unsafe { TRITONSERVER_Server::from_c(server) }?;
        if inference_request.is_null() {
            return Err(invalid_arg("inference_request is null"));
        }
        // SAFETY: `inference_request` is checked non-null above and is a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h).
        let r = unsafe { &mut *inference_request };
        let response = r.response.ok_or_else(|| {
            invalid_arg("the inference request has no response callback (TRITONSERVER_InferenceRequestSetResponseCallback)")
        })?;
        let request = r.to_infer_request()?;
        if callback_thread().is_none() {
            return Err(TRITONSERVER_Error::boxed(
                ERROR_UNAVAILABLE,
                "the C API callback thread could not be started",
            ));
        }
        let cancel = Arc::new(Cancel::default());
        // Before the request can run: once it has, its release callback
        // may have given it back to the caller, who may have deleted it.
        r.cancel = cancel.clone();
        let delivery = Arc::new(Delivery {
            request: inference_request,
            release: r.release,
            response,
            model_name: request.model_name.clone(),
            model_version: request.model_version.clone(),
            id: request.id.clone(),
        });
        let refused = Arc::new(AtomicBool::new(false));
        let pending = Pending {
            delivery: Some(delivery),
            refused: refused.clone(),
        };
        let consume = Box::new(move |stream: ResponseStream| -> LocalTask {
            Box::pin(run(stream, cancel, pending))
        });
        server
            .submit(request, consume)
            .map_err(|Refused { error, consume }| {
                // The caller gets this error and keeps its request: dropping
                // the unsent consumer must not call its callbacks.
                refused.store(true, Ordering::Release);
                drop(consume);
                TRITONSERVER_Error::boxed(error_kind_to_code(error.kind), error.message)
            })
    })
}
