//! Accept loop and per-connection HTTP/1.1 serving on a shard (hyper over
//! monoio). Each connection lives on the shard that accepted it.

use std::{future::Future, rc::Rc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn, Request, Response};
use monoio::{io::IntoPollIo, net::TcpListener};
use monoio_compat::hyper::{MonoioIo, MonoioTimer};

use crate::shard::{ConnectionGauge, Shard};

pub type HttpResponse = Response<Full<Bytes>>;

/// Accepts connections until the shard shuts down, serving each with `handler`.
pub async fn accept_loop<H, F>(
    listener: TcpListener,
    shard: Rc<Shard>,
    what: &'static str,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + 'static,
    F: Future<Output = HttpResponse> + 'static,
{
    loop {
        let accepted = monoio::select! {
            r = listener.accept() => r,
            _ = shard.shutdown.wait() => return,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                tracing::warn!(shard = shard.id, error = %e, "{what}: accept failed");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = ConnectionGauge::open(&shard);
        let handler = handler.clone();
        monoio::spawn(async move {
            let _connection = connection;
            let io = match stream.into_poll_io() {
                Ok(io) => MonoioIo::new(io),
                Err(e) => {
                    tracing::debug!(error = %e, "{what}: connection setup failed");
                    return;
                }
            };
            let service = service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, std::convert::Infallible>(handler(req).await) }
            });
            if let Err(e) = http1::Builder::new()
                .timer(MonoioTimer)
                .keep_alive(true)
                .serve_connection(io, service)
                .await
            {
                tracing::debug!(error = %e, "{what}: connection ended with an error");
            }
        });
    }
}
