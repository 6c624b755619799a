//! Start-up of the SageMaker and Vertex AI services: Triton's port rules
//! for them, their settings from the environment, and the Vertex AI
//! default model, chosen once the start-up load is done.

use std::net::IpAddr;

use anyhow::bail;

use super::ServerOptions;
use crate::{
    frontend::{
        env::FrontendEnv,
        http::{sagemaker::SagemakerSettings, vertex::VertexSettings},
    },
    model::ModelTable,
};

/// Triton's checks of the services' ports (`command_line_parser.cc`):
/// with `--sagemaker-safe-port-range`, every other service on the
/// SageMaker address must listen inside the range; and the SageMaker and
/// Vertex AI services may not share a port with another service on the
/// same address. The same holds for every pair of services here, on
/// overlapping addresses (equal, or either one unspecified): Triton's own
/// binds would fail, but our shards bind with SO_REUSEPORT, so two of our
/// listeners would share the port and split its connections between them
/// (an HTTPS client then reached the plaintext metrics listener). Port 0
/// (any free port) is never a conflict.
pub fn check_ports(options: &ServerOptions) -> anyhow::Result<()> {
    let host = options.host;
    let mut ports: Vec<(&str, IpAddr, u16)> = Vec::new();
    if options.allow_http {
        ports.push((
            "HTTP",
            options.http_address.unwrap_or(host),
            options.http_port,
        ));
    }
    if options.allow_grpc {
        ports.push((
            "GRPC",
            options.grpc_address.unwrap_or(host),
            options.grpc_port,
        ));
    }
    if options.allow_metrics {
        let address = options
            .metrics_address
            .or(options.http_address)
            .unwrap_or(host);
        ports.push(("metrics", address, options.metrics_port));
    }
    if options.allow_sagemaker {
        ports.push(("SageMaker", host, options.sagemaker_port));
    }
    if options.allow_vertex_ai {
        ports.push(("Vertex AI", host, options.vertex_ai_port));
    }
    let overlap = |a: IpAddr, b: IpAddr| a == b || a.is_unspecified() || b.is_unspecified();
    for (i, &(name, address, port)) in ports.iter().enumerate() {
        for &(other, other_address, other_port) in &ports[i + 1..] {
            if port == other_port && port != 0 && overlap(address, other_address) {
                bail!(
                    "The server cannot listen to {name} requests and {other} requests at the \
                     same address and port {address}:{port}"
                );
            }
        }
    }
    if let (true, Some((low, high))) = (options.allow_sagemaker, options.sagemaker_safe_port_range)
    {
        for &(name, address, port) in &ports {
            if name != "SageMaker" && address == host && (port < low || port > high) {
                bail!(
                    "The server cannot listen to {name} requests at port {port}, allowed port \
                     range is [{low}, {high}]"
                );
            }
        }
    }
    Ok(())
}

/// The SageMaker settings from the environment, installed before any
/// shard accepts.
pub fn install_sagemaker(options: &ServerOptions, env: &FrontendEnv) -> anyhow::Result<()> {
    if !options.allow_sagemaker {
        return Ok(());
    }
    let settings = SagemakerSettings::from_env()
        .map_err(|e| anyhow::anyhow!("failed to start the SageMaker service: {e}"))?;
    tracing::info!(
        model = %settings.model,
        invocation = ?settings.invocation,
        ping_live = settings.ping_live,
        "SageMaker service settings"
    );
    let _ = env.sagemaker.set(settings);
    Ok(())
}

/// The Vertex AI settings, once `table` (the start-up load) is known:
/// Triton starts the service only then, and fails the start when its
/// routes are not given or its default model is not loaded.
pub fn install_vertex(
    options: &ServerOptions,
    env: &FrontendEnv,
    table: &ModelTable,
) -> anyhow::Result<()> {
    if !options.allow_vertex_ai {
        return Ok(());
    }
    // One name per ready version, as Triton's ready model index.
    let ready: Vec<String> = table
        .models
        .keys()
        .flat_map(|name| {
            table
                .ready_versions(name)
                .into_iter()
                .map(move |_| name.clone())
        })
        .collect();
    let var = |k: &str| std::env::var(k).ok();
    let settings = VertexSettings::new(
        var("AIP_PREDICT_ROUTE").as_deref(),
        var("AIP_HEALTH_ROUTE").as_deref(),
        options.vertex_ai_default_model.as_deref(),
        &ready,
    )
    .map_err(|e| anyhow::anyhow!("failed to start the Vertex AI service: {e}"))?;
    tracing::info!(model = %settings.model, "Vertex AI service settings");
    let _ = env.vertex.set(settings);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> ServerOptions {
        let mut o = ServerOptions::new(vec!["/tmp/models".into()]);
        o.allow_sagemaker = true;
        o
    }

    #[test]
    fn sagemaker_ports_follow_tritons_rules() {
        assert!(check_ports(&options()).is_ok());
        let mut o = options();
        o.http_port = 8080;
        let e = check_ports(&o).unwrap_err().to_string();
        assert!(
            e.contains("HTTP requests and SageMaker requests at the same address and port"),
            "{e}"
        );
        let mut o = options();
        o.sagemaker_safe_port_range = Some((8000, 8001));
        let e = check_ports(&o).unwrap_err().to_string();
        assert!(
            e.contains("cannot listen to metrics requests at port 8002, allowed port range is [8000, 8001]"),
            "{e}"
        );
        o.allow_metrics = false;
        assert!(check_ports(&o).is_ok());
        // Off, the range means nothing.
        o.allow_sagemaker = false;
        o.allow_metrics = true;
        assert!(check_ports(&o).is_ok());
    }

    #[test]
    fn no_two_services_share_a_port() {
        let mut o = ServerOptions::new(vec!["/tmp/models".into()]);
        o.metrics_port = o.http_port;
        let e = check_ports(&o).unwrap_err().to_string();
        assert!(
            e.contains("HTTP requests and metrics requests at the same address and port"),
            "{e}"
        );
        // An unspecified address overlaps every other one.
        let mut o = ServerOptions::new(vec!["/tmp/models".into()]);
        o.grpc_port = o.http_port;
        o.http_address = Some("127.0.0.1".parse().unwrap());
        o.grpc_address = Some("0.0.0.0".parse().unwrap());
        assert!(check_ports(&o).is_err());
        // Distinct addresses may use the same port.
        o.grpc_address = Some("127.0.0.2".parse().unwrap());
        assert!(check_ports(&o).is_ok());
        // So may the services that are off, and port 0 never conflicts.
        o.grpc_address = None;
        o.allow_grpc = false;
        assert!(check_ports(&o).is_ok());
        let mut o = ServerOptions::new(vec!["/tmp/models".into()]);
        (o.http_port, o.grpc_port, o.metrics_port) = (0, 0, 0);
        assert!(check_ports(&o).is_ok());
    }
}
