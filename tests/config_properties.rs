//! Property tests (proptest, bounded cases) for the model configuration
//! parser: `config.pbtxt` text is repository input, so arbitrary text,
//! token soup in the protobuf text format's vocabulary, and mutations of
//! the example repository's own configurations must give a configuration
//! or an error — never a panic — through parsing, defaults, validation,
//! the supported-feature check and both printers. A configuration that
//! validates is within the server's bounds, and printing one and parsing
//! the text again gives the same configuration.

use proptest::{prelude::*, test_runner::Config};
use shardserve::{
    config::{
        check_supported, fill_defaults, model_config_from_json, model_config_to_json,
        model_config_to_text, parse_model_config, validate,
    },
    proto::inference::model_config::SchedulingChoice,
};

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// Words of `config.pbtxt`: field names, enum values, numbers at the
/// edges of their types, strings, and the format's punctuation.
const TOKENS: &[&str] = &[
    "name",
    "platform",
    "backend",
    "max_batch_size",
    "input",
    "output",
    "data_type",
    "dims",
    "reshape",
    "shape",
    "format",
    "instance_group",
    "count",
    "kind",
    "gpus",
    "dynamic_batching",
    "preferred_batch_size",
    "max_queue_delay_microseconds",
    "priority_levels",
    "default_priority_level",
    "default_queue_policy",
    "priority_queue_policy",
    "max_queue_size",
    "timeout_action",
    "default_timeout_microseconds",
    "allow_timeout_override",
    "sequence_batching",
    "control_input",
    "control",
    "int32_false_true",
    "state",
    "input_name",
    "output_name",
    "initial_state",
    "zero_data",
    "oldest",
    "direct",
    "max_sequence_idle_microseconds",
    "max_candidate_sequences",
    "ensemble_scheduling",
    "step",
    "model_name",
    "model_version",
    "input_map",
    "output_map",
    "key",
    "value",
    "parameters",
    "string_value",
    "version_policy",
    "latest",
    "num_versions",
    "specific",
    "versions",
    "all",
    "model_transaction_policy",
    "decoupled",
    "optional",
    "is_shape_tensor",
    "label_filename",
    "TYPE_FP32",
    "TYPE_INT32",
    "TYPE_STRING",
    "TYPE_BOOL",
    "TYPE_FP16",
    "TYPE_UINT64",
    "KIND_CPU",
    "KIND_GPU",
    "KIND_AUTO",
    "KIND_MODEL",
    "CONTROL_SEQUENCE_START",
    "CONTROL_SEQUENCE_CORRID",
    "REJECT",
    "DELAY",
    "FORMAT_NCHW",
    "true",
    "false",
    "0",
    "1",
    "-1",
    "8",
    "64",
    "1024",
    "1025",
    "1048576",
    "1048577",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "99999999999999999999999",
    "1e308",
    "-0.5",
    "nan",
    "inf",
    "\"\"",
    "\"x\"",
    "\"simple\"",
    "\"onnxruntime\"",
    "\"\\u0000\"",
    "\"\\xff\"",
    "'single'",
    "{",
    "}",
    "[",
    "]",
    "<",
    ">",
    ":",
    ",",
    ";",
    "#",
    "\n",
    " ",
];

fn token_soup() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(TOKENS), 0..80)
        .prop_map(|words| words.join(" "))
}

/// Every `config.pbtxt` of the example repository.
fn example_configs() -> Vec<String> {
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let mut texts: Vec<String> = std::fs::read_dir(&models)
        .expect("models/")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("config.pbtxt")).ok())
        .collect();
    texts.sort();
    assert!(
        texts.len() >= 10,
        "example configurations found: {}",
        texts.len()
    );
    texts
}

/// Edits of one example configuration: each replaces, inserts or removes
/// a byte or a token at a position.
#[derive(Debug, Clone)]
enum Edit {
    Replace(usize, u8),
    Insert(usize, &'static str),
    Remove(usize, usize),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Edit::Replace(at, b)),
        (any::<usize>(), proptest::sample::select(TOKENS)).prop_map(|(at, t)| Edit::Insert(at, t)),
        (any::<usize>(), 1usize..16).prop_map(|(at, n)| Edit::Remove(at, n)),
    ];
    proptest::collection::vec(edit, 1..6)
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for edit in edits {
        let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
        match *edit {
            Edit::Replace(i, b) if !bytes.is_empty() => {
                let i = at(i, bytes.len());
                bytes[i] = b;
            }
            Edit::Replace(..) => {}
            Edit::Insert(i, t) => {
                let i = at(i, bytes.len() + 1);
                bytes.splice(i..i, t.bytes());
            }
            Edit::Remove(i, n) => {
                let i = at(i, bytes.len());
                let end = (i + n).min(bytes.len());
                bytes.drain(i..end);
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Runs `text` through everything the repository does with a
/// configuration; checks the properties of one that parses.
fn check(text: &str) -> Result<(), TestCaseError> {
    let Ok(mut parsed) = parse_model_config(text) else {
        return Ok(());
    };
    // Printing and parsing again is the identity.
    let printed = model_config_to_text(&parsed);
    let again = parse_model_config(&printed).map_err(|e| {
        TestCaseError::fail(format!("printed config does not parse: {e:#}\n{printed}"))
    })?;
    prop_assert_eq!(&again, &parsed, "text round trip changed the configuration");
    let json = model_config_to_json(&parsed);
    if let Ok(back) = model_config_from_json(&json.to_string()) {
        prop_assert_eq!(&back, &parsed, "JSON round trip changed the configuration");
    }
    fill_defaults(&mut parsed);
    let _ = check_supported(&parsed);
    if validate(&parsed).is_ok() {
        prop_assert!(
            parsed.max_batch_size <= 1 << 20,
            "max_batch_size {}",
            parsed.max_batch_size
        );
        let instances: i64 = parsed
            .instance_group
            .iter()
            .map(|g| i64::from(g.count))
            .sum();
        prop_assert!(instances <= 1024, "{instances} instances validated");
        if let Some(SchedulingChoice::DynamicBatching(d)) = &parsed.scheduling_choice {
            prop_assert!(
                d.priority_levels <= 1024,
                "priority_levels {}",
                d.priority_levels
            );
            prop_assert!(d.preferred_batch_size.len() <= 1024);
        }
        let dims = parsed.input.iter().map(|t| t.dims.len());
        for n in dims.chain(parsed.output.iter().map(|t| t.dims.len())) {
            prop_assert!(n <= 64, "{n} dims");
        }
    }
    let _ = model_config_to_text(&parsed);
    let _ = model_config_to_json(&parsed);
    Ok(())
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
        check(&text)?;
    }

    #[test]
    fn token_soup_never_panics(text in token_soup()) {
        check(&text)?;
    }
}

proptest! {
    #![proptest_config(config(4000))]

    #[test]
    fn mutated_example_configs_never_panic(which in any::<usize>(), edits in edits()) {
        let examples = example_configs();
        let original = &examples[which % examples.len()];
        check(&apply(original, &edits))?;
    }
}

#[test]
fn every_example_config_validates_and_round_trips() {
    for text in example_configs() {
        let parsed = parse_model_config(&text).expect("example parses");
        let again = parse_model_config(&model_config_to_text(&parsed)).expect("printed parses");
        assert_eq!(again, parsed);
        let mut filled = parsed;
        fill_defaults(&mut filled);
        validate(&filled).unwrap_or_else(|e| panic!("{}: {e:#}", filled.name));
    }
}
