//! Server and model metadata (KServe `GET /v2`, `GET /v2/models/{m}`,
//! gRPC `ServerMetadata`/`ModelMetadata`, `TRITONSERVER_ServerMetadata`
//! and `TRITONSERVER_ServerModelMetadata`) as one typed value each.

use serde_json::{json, Value};

use crate::{
    frontend::{
        env::{self, FrontendEnv},
        identity,
    },
    model::{metadata::TensorMetadata, ModelTable, ModelVersion},
};

/// What the server says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerMetadata {
    pub name: String,
    pub version: &'static str,
    pub extensions: &'static [&'static str],
}

impl ServerMetadata {
    /// The metadata of the server `env` describes.
    pub fn of(env: &FrontendEnv) -> Self {
        Self {
            name: env.server_name.clone(),
            version: identity::VERSION,
            extensions: env.extensions(),
        }
    }

    /// The metadata of the server this thread serves (the defaults off a
    /// server thread).
    pub fn current() -> Self {
        Self {
            name: env::server_name(),
            version: identity::VERSION,
            extensions: identity::extensions(),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "version": self.version,
            "extensions": self.extensions,
        })
    }
}

/// One model version's metadata, borrowed from the model table.
#[derive(Debug, Clone)]
pub struct ModelMetadata<'a> {
    pub name: &'a str,
    /// Every ready version of the model, not only the one asked for (as
    /// Triton answers).
    pub versions: Vec<i64>,
    pub platform: &'a str,
    pub inputs: &'a [TensorMetadata],
    pub outputs: &'a [TensorMetadata],
}

impl<'a> ModelMetadata<'a> {
    /// `m`'s metadata; `table` supplies the model's ready versions.
    pub fn new(table: &ModelTable, m: &'a ModelVersion) -> Self {
        Self {
            name: &m.name,
            versions: table.ready_versions(&m.name),
            platform: &m.metadata.platform,
            inputs: &m.metadata.inputs,
            outputs: &m.metadata.outputs,
        }
    }

    /// The versions as the wire carries them: decimal strings.
    pub fn version_strings(&self) -> Vec<String> {
        self.versions.iter().map(i64::to_string).collect()
    }

    pub fn to_json(&self) -> Value {
        let tensors = |list: &[TensorMetadata]| {
            list.iter()
                .map(|t| json!({"name": t.name, "datatype": t.datatype, "shape": t.shape}))
                .collect::<Vec<_>>()
        };
        json!({
            "name": self.name,
            "versions": self.version_strings(),
            "platform": self.platform,
            "inputs": tensors(self.inputs),
            "outputs": tensors(self.outputs),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_metadata_json() {
        let mut env = FrontendEnv::new(crate::trace::Tracer::new(&Default::default()));
        env.server_name = "custom".into();
        let meta = ServerMetadata::of(&env);
        let json = meta.to_json();
        assert_eq!(json["name"], "custom");
        assert_eq!(json["version"], identity::VERSION);
        assert_eq!(json["extensions"][0], identity::EXTENSIONS[0]);
        // Off a server thread: the default name.
        assert_eq!(
            ServerMetadata::current().name,
            identity::DEFAULT_SERVER_NAME
        );
    }
}
