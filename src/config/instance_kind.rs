//! Resolving instance group kinds against the GPUs this server has, as
//! Triton's model loading does (normalize, then validate), with Triton's
//! messages: `KIND_AUTO` becomes `KIND_GPU` on every GPU where the backend
//! can use one, else `KIND_CPU`; `KIND_GPU` without `gpus` means all GPUs;
//! a `KIND_GPU` group naming a GPU that is not there fails the load.
//! Runs after `fill_defaults` (groups are named by then).

use anyhow::bail;

use crate::proto::inference::{model_instance_group::Kind, ModelConfig};

/// Triton's `--min-supported-compute-capability` default, as its messages
/// print it (`std::to_string(6.0)`).
const MIN_COMPUTE_CAPABILITY_TEXT: &str = "6.000000";

/// `gpus`: the ids (CUDA ordinals) of the usable GPUs. `backend_gpu`:
/// whether the model's backend can run instances on a GPU; `backend` names
/// it in the refusal.
pub fn resolve_instance_kinds(
    config: &mut ModelConfig,
    gpus: &[i32],
    backend_gpu: bool,
    backend: &str,
) -> anyhow::Result<()> {
    let model = config.name.clone();
    for group in &mut config.instance_group {
        if group.kind == Kind::Auto as i32 {
            group.kind = if !gpus.is_empty() && backend_gpu {
                Kind::Gpu as i32
            } else {
                Kind::Cpu as i32
            };
        }
        if group.kind != Kind::Gpu as i32 {
            continue;
        }
        if group.gpus.is_empty() {
            if gpus.is_empty() {
                bail!(
                    "instance group {} of model {model} has kind KIND_GPU but no GPUs are available",
                    group.name
                );
            }
            group.gpus = gpus.to_vec();
        }
        if let Some(bad) = group.gpus.iter().find(|g| !gpus.contains(g)) {
            bail!(
                "instance group {} of model {model} specifies invalid or unsupported gpu id {bad}. \
                 GPUs with at least the minimum required CUDA compute compatibility of \
                 {MIN_COMPUTE_CAPABILITY_TEXT} are: {}",
                group.name,
                gpus.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if !backend_gpu {
            bail!(
                "instance group {} of model {model} has kind KIND_GPU but backend '{backend}' \
                 runs on CPU only in shardserve",
                group.name
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{fill_defaults, test_support::config};

    fn resolved(extra: &str, gpus: &[i32], backend_gpu: bool) -> anyhow::Result<ModelConfig> {
        let mut c = config(extra);
        fill_defaults(&mut c);
        resolve_instance_kinds(&mut c, gpus, backend_gpu, "onnxruntime").map(|()| c)
    }

    fn err(extra: &str, gpus: &[i32]) -> String {
        format!("{:#}", resolved(extra, gpus, true).unwrap_err())
    }

    #[test]
    fn auto_is_cpu_without_gpus_and_gpu_with_them() {
        let c = resolved("instance_group [ { kind: KIND_AUTO } ]", &[], true).unwrap();
        assert_eq!(c.instance_group[0].kind, Kind::Cpu as i32);
        assert!(c.instance_group[0].gpus.is_empty());
        let c = resolved("instance_group [ { kind: KIND_AUTO } ]", &[0, 1], true).unwrap();
        assert_eq!(c.instance_group[0].kind, Kind::Gpu as i32);
        assert_eq!(c.instance_group[0].gpus, vec![0, 1]);
        let c = resolved("instance_group [ { kind: KIND_AUTO } ]", &[0, 1], false).unwrap();
        assert_eq!(
            c.instance_group[0].kind,
            Kind::Cpu as i32,
            "CPU-only backend"
        );
    }

    #[test]
    fn a_bare_config_on_a_gpu_machine_stays_on_cpu() {
        // fill_defaults writes KIND_CPU for a config without groups, as
        // this server has always done; only KIND_AUTO follows the GPUs.
        let c = resolved("", &[0], true).unwrap();
        assert_eq!(c.instance_group[0].kind, Kind::Cpu as i32);
    }

    #[test]
    fn gpu_without_gpus_listed_means_every_gpu() {
        let c = resolved(
            "instance_group [ { count: 2 kind: KIND_GPU } ]",
            &[0, 1, 2],
            true,
        )
        .unwrap();
        assert_eq!(c.instance_group[0].gpus, vec![0, 1, 2]);
        assert_eq!(c.instance_group[0].count, 2);
    }

    #[test]
    fn tritons_refusals_without_a_gpu() {
        assert_eq!(
            err("instance_group [ { kind: KIND_GPU } ]", &[]),
            "instance group m_0 of model m has kind KIND_GPU but no GPUs are available"
        );
        assert_eq!(
            err(
                "instance_group [ { name: \"g\" kind: KIND_GPU gpus: [ 1 ] } ]",
                &[]
            ),
            "instance group g of model m specifies invalid or unsupported gpu id 1. GPUs with \
             at least the minimum required CUDA compute compatibility of 6.000000 are: "
        );
        assert!(err("instance_group [ { kind: KIND_GPU gpus: [ 0, 3 ] } ]", &[0, 1])
            .ends_with("gpu id 3. GPUs with at least the minimum required CUDA compute compatibility of 6.000000 are: 0, 1"));
    }

    #[test]
    fn cpu_only_backends_refuse_gpu_groups() {
        let e = format!(
            "{:#}",
            resolved("instance_group [ { kind: KIND_GPU } ]", &[0], false).unwrap_err()
        );
        assert!(e.contains("runs on CPU only"), "{e}");
    }
}
