//! The JSON form of a model configuration, as Triton serves it on
//! `GET /v2/models/{m}/config` and accepts in configuration overrides.

use anyhow::Context;
use prost_reflect::{DeserializeOptions, DynamicMessage, SerializeOptions};

use super::descriptor;
use crate::proto::inference::ModelConfig;

/// Triton's JSON for a configuration: the protobuf JSON mapping with the
/// `.proto` field names (`max_batch_size`), enums by name, every scalar,
/// repeated and map field printed even when it holds its default (unset
/// sub-messages are left out, as protobuf's printer does), and 64-bit
/// integers as numbers rather than strings, which is what Triton's
/// `/config` returns and tritonclient expects.
pub fn model_config_to_json(config: &ModelConfig) -> serde_json::Value {
    match try_to_json(config) {
        Ok(value) => value,
        Err(e) => {
            // Only reachable with a broken built-in descriptor set; keep the
            // endpoint answering with what is certainly known.
            tracing::error!(model = %config.name, error = %format!("{e:#}"), "cannot print the model configuration as JSON");
            serde_json::json!({ "name": config.name, "max_batch_size": config.max_batch_size })
        }
    }
}

fn try_to_json(config: &ModelConfig) -> anyhow::Result<serde_json::Value> {
    let message = descriptor::to_dynamic(config)?;
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(false)
        .stringify_64_bit_integers(false);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .context("cannot print the model configuration as JSON")
}

/// Parses Triton's JSON form of a configuration: field names in snake_case
/// or camelCase, enums by name or number, integers as numbers or strings
/// (tritonclient sends `{"max_batch_size": "16"}`). Unknown fields are an
/// error, as in Triton.
pub fn model_config_from_json(json: &str) -> anyhow::Result<ModelConfig> {
    let desc = descriptor::model_config()?;
    let mut deserializer = serde_json::Deserializer::from_str(json);
    let message = DynamicMessage::deserialize_with_options(
        desc,
        &mut deserializer,
        &DeserializeOptions::new(),
    )
    .context("invalid model configuration JSON")?;
    deserializer
        .end()
        .context("invalid model configuration JSON: trailing characters")?;
    descriptor::from_dynamic(&message)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        config::parse_model_config,
        proto::inference::{model_config::SchedulingChoice, DataType},
    };

    fn simple() -> ModelConfig {
        parse_model_config(
            r#"
            name: "simple"
            backend: "simple"
            max_batch_size: 8
            input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
            output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1, 16 ] } ]
            instance_group [ { count: 1, kind: KIND_CPU } ]
            dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 priority_levels: 2 default_priority_level: 1 }
            parameters { key: "execute_delay_ms" value: { string_value: "3" } }
            "#,
        )
        .unwrap()
    }

    #[test]
    fn json_uses_proto_field_names_and_enum_names() {
        let j = model_config_to_json(&simple());
        assert_eq!(j["max_batch_size"], json!(8));
        assert_eq!(j["input"][0]["data_type"], json!("TYPE_INT32"));
        assert_eq!(j["instance_group"][0]["kind"], json!("KIND_CPU"));
        assert!(j.get("maxBatchSize").is_none());
    }

    #[test]
    fn json_prints_64_bit_integers_as_numbers() {
        let j = model_config_to_json(&simple());
        assert_eq!(j["input"][0]["dims"], json!([16]));
        assert_eq!(j["output"][0]["dims"], json!([-1, 16]));
        assert_eq!(
            j["dynamic_batching"]["max_queue_delay_microseconds"],
            json!(100)
        );
        assert_eq!(j["dynamic_batching"]["priority_levels"], json!(2));
    }

    #[test]
    fn json_prints_default_fields() {
        let j = model_config_to_json(&simple());
        assert_eq!(j["platform"], json!(""));
        assert_eq!(j["input"][0]["format"], json!("FORMAT_NONE"));
        assert_eq!(j["input"][0]["optional"], json!(false));
        assert_eq!(j["output"][0]["label_filename"], json!(""));
        assert_eq!(j["batch_input"], json!([]));
        assert_eq!(j["metric_tags"], json!({}));
        assert_eq!(j["dynamic_batching"]["preserve_ordering"], json!(false));
    }

    #[test]
    fn json_leaves_out_unset_sub_messages() {
        let j = model_config_to_json(&simple());
        assert!(j.get("sequence_batching").is_none());
        assert!(j.get("ensemble_scheduling").is_none());
        assert!(j.get("response_cache").is_none());
        assert!(j["input"][0].get("reshape").is_none());
    }

    #[test]
    fn json_prints_maps_as_objects() {
        let j = model_config_to_json(&simple());
        assert_eq!(
            j["parameters"],
            json!({ "execute_delay_ms": { "string_value": "3" } })
        );
    }

    #[test]
    fn json_round_trips() {
        let config = simple();
        let text = model_config_to_json(&config).to_string();
        assert_eq!(model_config_from_json(&text).unwrap(), config);
    }

    #[test]
    fn json_input_accepts_camel_case_and_stringified_integers() {
        let c = model_config_from_json(
            r#"{"maxBatchSize": "16", "input": [{"name": "x", "dataType": "TYPE_FP32", "dims": ["4", -1]}],
                "dynamic_batching": {"max_queue_delay_microseconds": "250"}}"#,
        )
        .unwrap();
        assert_eq!(c.max_batch_size, 16);
        assert_eq!(c.input[0].data_type, DataType::TypeFp32 as i32);
        assert_eq!(c.input[0].dims, vec![4, -1]);
        let Some(SchedulingChoice::DynamicBatching(d)) = c.scheduling_choice else {
            panic!("no dynamic batching")
        };
        assert_eq!(d.max_queue_delay_microseconds, 250);
    }

    #[test]
    fn json_input_accepts_enum_numbers() {
        let c = model_config_from_json(r#"{"input": [{"name": "x", "data_type": 8}]}"#).unwrap();
        assert_eq!(c.input[0].data_type, DataType::TypeInt32 as i32);
    }

    #[test]
    fn json_input_rejects_unknown_fields_with_position() {
        let e = format!(
            "{:#}",
            model_config_from_json("{\n  \"max_batch_sise\": 1\n}").unwrap_err()
        );
        assert!(e.contains("max_batch_sise"), "{e}");
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn json_input_rejects_bad_enum_names() {
        let e = format!(
            "{:#}",
            model_config_from_json(r#"{"input": [{"data_type": "TYPE_NOPE"}]}"#).unwrap_err()
        );
        assert!(e.contains("TYPE_NOPE"), "{e}");
    }

    #[test]
    fn json_input_rejects_trailing_garbage() {
        assert!(model_config_from_json(r#"{"name": "a"} x"#).is_err());
    }
}
