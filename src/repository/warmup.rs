//! Builds a model's warmup samples (`model_warmup`) from its
//! configuration, as Triton's `GenerateWarmupData` does, and checks them
//! against the model before any instance runs them
//! (`scheduler::warmup` runs them):
//!
//! - a sample with `batch_size: 0` is skipped; otherwise it is
//!   `batch_size` requests of one batch row each (`[1] + dims` when the
//!   model batches, `dims` when it does not);
//! - `zero_data`: zeros (a BYTES input: empty strings, four zero bytes of
//!   length each); `random_data`: random bytes (a BYTES input: empty
//!   strings too, as Triton does); `input_data_file`: a file of the
//!   model's `warmup/` folder, read as the tensor's raw bytes (a BYTES
//!   input: the whole file, in the length-prefixed form; others: its first
//!   bytes, and it must hold enough);
//! - every `dims` entry must be fixed; a sample's inputs are validated like
//!   a client's request, so a datatype, shape or name that does not fit
//!   the model fails the load with the reason. Inputs that are not the
//!   model's are allowed for sequence models only (control and state
//!   inputs the sample provides itself, as in Triton);
//! - a data file path must stay inside `warmup/` (no absolute path, no
//!   `..`, no symbolic link out of it).

use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};
use bytes::Bytes;

use crate::{
    model::{validate_request, IoSpec},
    proto::inference::{
        model_warmup::{input::InputDataType, Input},
        ModelConfig, ModelWarmup,
    },
    scheduler::warmup::WarmupSample,
    types::{DataType, InferRequest, Tensor},
};

/// Triton's folder of warmup data files, inside the model's folder.
const WARMUP_FOLDER: &str = "warmup";

/// Bytes one warmup input may take: a sample is made in memory before
/// the model is ready, and a typo in `dims` must fail the load, never
/// exhaust the host.
const MAX_INPUT_BYTES: usize = 1 << 30;

/// The samples of `config` (empty without `model_warmup`), checked
/// against the model's inputs `io`.
pub(super) fn samples(
    config: &ModelConfig,
    model_dir: &Path,
    io: &IoSpec,
    sequence_model: bool,
) -> anyhow::Result<Vec<WarmupSample>> {
    let mut samples = Vec::new();
    for setting in &config.model_warmup {
        if setting.batch_size == 0 {
            tracing::debug!(model = %config.name, sample = %setting.name, "skipping batch 0 warmup sample");
            continue;
        }
        let sample = sample(config, model_dir, io, sequence_model, setting)
            .with_context(|| format!("warmup sample '{}'", setting.name))?;
        samples.push(sample);
    }
    Ok(samples)
}

fn sample(
    config: &ModelConfig,
    model_dir: &Path,
    io: &IoSpec,
    sequence_model: bool,
    setting: &ModelWarmup,
) -> anyhow::Result<WarmupSample> {
    let max_batch = i64::from(config.max_batch_size);
    // Triton hands the instance the whole sample as one batch, which the
    // backend refuses when it exceeds the model's maximum.
    if max_batch > 0 && i64::from(setting.batch_size) > max_batch {
        bail!(
            "batch size {} for '{}', max allowed is {max_batch}",
            setting.batch_size,
            config.name
        );
    }
    // Sorted: the same request whatever order the map iterates in.
    let mut names: Vec<&String> = setting.inputs.keys().collect();
    names.sort();
    let mut request = InferRequest {
        model_name: config.name.clone(),
        model_version: String::new(),
        id: String::new(),
        ..Default::default()
    };
    let mut extra = Vec::new();
    for name in names {
        let input = &setting.inputs[name];
        let own = io.input(name).is_some();
        if !own && !sequence_model {
            bail!(
                "unexpected inference input '{name}' for model '{}'",
                config.name
            );
        }
        let datatype = DataType::from_config_i32(input.data_type).with_context(|| {
            format!("warmup setting expects input '{name}' to have a valid data_type")
        })?;
        let data = input_data(model_dir, name, datatype, input)?;
        let mut shape = Vec::with_capacity(input.dims.len() + 1);
        if max_batch > 0 {
            shape.push(1);
        }
        shape.extend_from_slice(&input.dims);
        let tensor = Tensor::new(name.clone(), datatype, shape, data);
        if own {
            request.inputs.push(tensor);
        } else {
            extra.push(tensor);
        }
    }
    validate_request(io, &config.name, &mut request).map_err(|e| anyhow::anyhow!(e.message))?;
    // Control and state inputs join after validation, which knows only
    // the model's own inputs.
    request.inputs.extend(extra);
    Ok(WarmupSample {
        name: setting.name.clone(),
        requests: vec![request; setting.batch_size as usize],
        count: setting.count,
    })
}

/// The bytes of one warmup input.
fn input_data(
    model_dir: &Path,
    name: &str,
    datatype: DataType,
    input: &Input,
) -> anyhow::Result<Bytes> {
    if input.dims.iter().any(|&d| d < 0) {
        bail!(
            "warmup setting expects all variable-size dimensions are specified for input '{name}'"
        );
    }
    // BYTES elements are a four-byte length each (zero: empty strings).
    let element_bytes = datatype.element_size().unwrap_or(4);
    let size = input
        .dims
        .iter()
        .try_fold(element_bytes, |acc, &d| {
            usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
        })
        .filter(|&s| s <= MAX_INPUT_BYTES)
        .with_context(|| {
            format!(
                "input '{name}' of dims {:?} takes more than the {MAX_INPUT_BYTES} bytes a warmup input may",
                input.dims
            )
        })?;
    match &input.input_data_type {
        Some(InputDataType::ZeroData(_)) => zeros(size),
        Some(InputDataType::RandomData(_)) if datatype == DataType::Bytes => zeros(size),
        Some(InputDataType::RandomData(_)) => random(size),
        Some(InputDataType::InputDataFile(file)) => {
            let path = data_file(model_dir, file)?;
            let data = std::fs::read(&path)
                .with_context(|| format!("unable to read warmup data file {}", path.display()))?;
            if datatype == DataType::Bytes {
                return Ok(Bytes::from(data));
            }
            if data.len() < size {
                bail!(
                    "warmup setting expects {size} bytes, but the data provided from {file} only has {} bytes",
                    data.len()
                );
            }
            let mut data = data;
            data.truncate(size);
            Ok(Bytes::from(data))
        }
        None => bail!("warmup setting expects input '{name}' to have input_data_type set"),
    }
}

fn zeros(size: usize) -> anyhow::Result<Bytes> {
    let mut v = Vec::new();
    v.try_reserve_exact(size)
        .with_context(|| format!("cannot allocate {size} bytes of warmup data"))?;
    v.resize(size, 0u8);
    Ok(Bytes::from(v))
}

/// Random bytes (any values: NaNs included, as in Triton); xorshift64*
/// seeded from the clock: warmup data needs no better randomness.
fn random(size: usize) -> anyhow::Result<Bytes> {
    let mut v = Vec::new();
    v.try_reserve_exact(size)
        .with_context(|| format!("cannot allocate {size} bytes of warmup data"))?;
    let mut state = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
        | 1;
    while v.len() < size {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let word = state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        let take = (size - v.len()).min(word.len());
        v.extend_from_slice(&word[..take]);
    }
    Ok(Bytes::from(v))
}

/// The path of a data file inside the model's `warmup/` folder; anything
/// that would leave it is refused.
fn data_file(model_dir: &Path, file: &str) -> anyhow::Result<PathBuf> {
    let relative = Path::new(file);
    let plain = !file.is_empty()
        && relative
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !plain {
        bail!(
            "warmup data file '{file}' must be a relative path inside the model's {WARMUP_FOLDER}/ folder"
        );
    }
    let folder = model_dir.join(WARMUP_FOLDER);
    let path = folder.join(relative);
    // A symbolic link inside the folder must not lead out of it either.
    let (real_folder, real_path) = match (folder.canonicalize(), path.canonicalize()) {
        (Ok(f), Ok(p)) => (f, p),
        _ => bail!("warmup data file {} not found", path.display()),
    };
    if !real_path.starts_with(&real_folder) {
        bail!("warmup data file '{file}' leads out of the model's {WARMUP_FOLDER}/ folder");
    }
    Ok(real_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_files_stay_inside_the_warmup_folder() {
        let root = std::env::temp_dir().join(format!("warmup_files_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = Dir(root);
        let warmup = dir.path().join(WARMUP_FOLDER);
        std::fs::create_dir_all(&warmup).expect("mkdir");
        std::fs::write(warmup.join("in.bin"), [1u8, 2, 3, 4]).expect("write");
        std::fs::write(dir.path().join("secret"), [0u8; 4]).expect("write");
        assert!(data_file(dir.path(), "in.bin").is_ok());
        assert!(data_file(dir.path(), "./in.bin").is_ok());
        for bad in ["../secret", "/etc/passwd", "", "a/../../secret"] {
            let e = format!("{:#}", data_file(dir.path(), bad).unwrap_err());
            assert!(e.contains("relative path inside"), "{bad}: {e}");
        }
        std::os::unix::fs::symlink(dir.path().join("secret"), warmup.join("link"))
            .expect("symlink");
        let e = format!("{:#}", data_file(dir.path(), "link").unwrap_err());
        assert!(e.contains("leads out"), "{e}");
        let e = format!("{:#}", data_file(dir.path(), "missing.bin").unwrap_err());
        assert!(e.contains("not found"), "{e}");
    }

    /// A folder removed when the test ends.
    struct Dir(PathBuf);

    impl Dir {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn random_data_has_the_size_asked_for() {
        assert_eq!(random(13).expect("random").len(), 13);
        assert_eq!(zeros(8).expect("zeros").as_ref(), &[0u8; 8]);
    }
}
