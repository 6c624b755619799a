//! `config.pbtxt`: protobuf text format, as Triton writes it.
//!
//! prost-reflect parses the text format, but it insists on a `:` between a
//! field name and a `[ ... ]` list, while Triton's parser (protobuf C++) lets
//! message lists omit it: `input [ { ... } ]`. A small lexer therefore walks
//! the text first, inserts the missing colons (never inside string literals
//! or `#` comments), and reports unbalanced brackets and unterminated strings
//! itself, with the position of both ends. Errors found later by prost-reflect
//! are mapped back to a line and column of the original text.

use std::fmt;

use prost_reflect::{text_format::FormatOptions, DynamicMessage};

use super::descriptor;
use crate::proto::inference::ModelConfig;

/// A syntax or schema error in a `config.pbtxt`, at a 1-based line and
/// column (in characters) of the original text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ConfigSyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.column, self.message
        )
    }
}

impl std::error::Error for ConfigSyntaxError {}

/// Parses a `config.pbtxt`. Accepts everything Triton's parser accepts in
/// practice: `#` comments, `field [ ... ]` lists with or without a colon,
/// `{ }` or `< >` message delimiters, `,`/`;` separators, enum names, maps
/// written as `{ key: ... value: ... }` entries.
pub fn parse_model_config(text: &str) -> anyhow::Result<ModelConfig> {
    let desc = descriptor::model_config()?;
    // Editors on Windows may save a byte-order mark; it is not text.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let prepared = insert_list_colons(text)?;
    let message = DynamicMessage::parse_text_format(desc, &prepared.text)
        .map_err(|e| prepared.locate(text, &e))?;
    descriptor::from_dynamic(&message)
}

/// Prints a configuration as (pretty) protobuf text format, with the fields
/// that hold their default value left out. The output parses back with
/// [`parse_model_config`].
pub fn model_config_to_text(config: &ModelConfig) -> String {
    match descriptor::to_dynamic(config) {
        Ok(message) => message.to_text_format_with_options(&FormatOptions::new().pretty(true)),
        Err(e) => format!("# cannot print the model configuration: {e:#}\n"),
    }
}

/// The text handed to prost-reflect, and where colons were inserted
/// (offsets into the original text, ascending).
struct Prepared {
    text: String,
    inserted_at: Vec<usize>,
}

impl Prepared {
    /// Offset in the original text of an offset in the prepared text.
    fn original_offset(&self, prepared: usize) -> usize {
        let shifted = self
            .inserted_at
            .iter()
            .enumerate()
            .take_while(|(k, at)| **at + k < prepared)
            .count();
        prepared - shifted
    }

    /// Turns a prost-reflect error into one with a position in `original`.
    fn locate(
        &self,
        original: &str,
        err: &prost_reflect::text_format::ParseError,
    ) -> anyhow::Error {
        let message = improve_message(&err.to_string());
        let offset = error_offset(err, self.text.len()).map(|o| self.original_offset(o));
        match offset {
            Some(offset) => {
                let (line, column) = line_column(original, offset);
                ConfigSyntaxError {
                    line,
                    column,
                    message,
                }
                .into()
            }
            None => anyhow::anyhow!("{message}"),
        }
    }
}

/// Where prost-reflect's error points, as a byte offset of the parsed text.
///
/// prost-reflect keeps the span private unless its `miette` feature is on;
/// every error kind that has one prints it last in its `Debug` form
/// (`span: 12..17`), which is what is read here. Errors at the end of the
/// input carry no span and point at the end.
fn error_offset(err: &prost_reflect::text_format::ParseError, text_len: usize) -> Option<usize> {
    let debug = format!("{err:?}");
    if let Some(at) = debug.rfind("span: ") {
        let rest = &debug[at + "span: ".len()..];
        let digits: &str = rest.split("..").next().unwrap_or_default();
        if let Ok(start) = digits.parse::<usize>() {
            return Some(start.min(text_len));
        }
    }
    if err.to_string().contains("reached end of input") {
        return Some(text_len);
    }
    None
}

/// Rewrites prost-reflect's messages for unknown fields and enum values so
/// that they say what would have been accepted.
fn improve_message(message: &str) -> String {
    if let Some((field, owner)) = message
        .strip_prefix("field '")
        .and_then(|m| m.strip_suffix('\''))
        .and_then(|m| m.split_once("' not found for message '"))
    {
        let mut out = format!("unknown field '{field}' in {owner}");
        if let Some(desc) = descriptor::message(owner) {
            let names: Vec<String> = desc.fields().map(|f| f.name().to_string()).collect();
            match closest(field, &names) {
                Some(best) => out.push_str(&format!(" (did you mean '{best}'?)")),
                None => out.push_str(&format!(" (known fields: {})", names.join(", "))),
            }
        }
        return out;
    }
    if let Some((value, enum_name)) = message
        .strip_prefix("value '")
        .and_then(|m| m.strip_suffix('\''))
        .and_then(|m| m.split_once("' was not found for enum '"))
    {
        let mut out = format!("'{value}' is not a value of enum {enum_name}");
        if let Some(names) = descriptor::enum_names(enum_name) {
            out.push_str(&format!(" (expected one of: {})", names.join(", ")));
        }
        return out;
    }
    if message.ends_with("but found ']'") {
        return format!("{message} (lists cannot end with a ',')");
    }
    if let Some(found) = message.strip_prefix("expected ':' or a message value, but found ") {
        return format!("expected ':' between the field name and its value, but found {found}");
    }
    message.to_string()
}

/// The candidate within a small edit distance of `word`, if any.
fn closest<'a>(word: &str, candidates: &'a [String]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.as_str())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitution.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// 1-based line and character column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |p| p + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

fn syntax_error(text: &str, offset: usize, message: String) -> ConfigSyntaxError {
    let (line, column) = line_column(text, offset);
    ConfigSyntaxError {
        line,
        column,
        message,
    }
}

/// What the lexer saw last, as far as deciding about a missing colon goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Last {
    /// An identifier in field-name position, ending at this offset.
    FieldName(usize),
    Colon,
    Other,
}

fn closer_of(open: u8) -> u8 {
    match open {
        b'{' => b'}',
        b'<' => b'>',
        _ => b']',
    }
}

/// Inserts `:` between a field name and a following `[`, and checks that
/// strings are terminated and brackets balanced.
///
/// An identifier is a field name when it does not follow a `:` (then it is
/// an enum value) and does not sit directly inside a `[ ... ]` list (then it
/// is a list element).
fn insert_list_colons(text: &str) -> Result<Prepared, ConfigSyntaxError> {
    let bytes = text.as_bytes();
    let mut open: Vec<(u8, usize)> = Vec::new();
    let mut inserted_at = Vec::new();
    let mut last = Last::Other;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'"' | b'\'' => {
                i = string_end(text, i)?;
                last = Last::Other;
                continue;
            }
            b if b.is_ascii_alphabetic() || b == b'_' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let in_list = matches!(open.last(), Some((b'[', _)));
                last = if in_list || last == Last::Colon {
                    Last::Other
                } else {
                    Last::FieldName(i)
                };
                continue;
            }
            b if b.is_ascii_digit() || b == b'.' => {
                // Numbers (`1.5e3`, `0x1F`, `2f`) are one token: a letter
                // inside one must not be taken for a field name.
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'_' | b'.'))
                {
                    i += 1;
                }
                last = Last::Other;
                continue;
            }
            b'[' => {
                if let Last::FieldName(end) = last {
                    inserted_at.push(end);
                }
                open.push((b, i));
                last = Last::Other;
            }
            b'{' | b'<' => {
                open.push((b, i));
                last = Last::Other;
            }
            b'}' | b'>' | b']' => {
                match open.pop() {
                    Some((o, _)) if closer_of(o) == b => {}
                    Some((o, at)) => {
                        let (line, column) = line_column(text, at);
                        return Err(syntax_error(
                            text,
                            i,
                            format!(
                                "'{}' does not close the '{}' opened at line {line}, column {column} \
                                 (expected '{}')",
                                b as char,
                                o as char,
                                closer_of(o) as char
                            ),
                        ));
                    }
                    None => {
                        return Err(syntax_error(
                            text,
                            i,
                            format!(
                                "'{}' closes nothing: there is no matching opening bracket",
                                b as char
                            ),
                        ))
                    }
                }
                last = Last::Other;
            }
            b':' => last = Last::Colon,
            b if b.is_ascii_whitespace() => {}
            _ => last = Last::Other,
        }
        i += 1;
    }
    if let Some((o, at)) = open.pop() {
        return Err(syntax_error(
            text,
            at,
            format!(
                "'{}' is never closed (expected a matching '{}' before the end of the file)",
                o as char,
                closer_of(o) as char
            ),
        ));
    }

    let mut out = String::with_capacity(text.len() + inserted_at.len());
    let mut from = 0;
    for &at in &inserted_at {
        out.push_str(&text[from..at]);
        out.push(':');
        from = at;
    }
    out.push_str(&text[from..]);
    Ok(Prepared {
        text: out,
        inserted_at,
    })
}

/// Offset just past the string literal starting at `start` (a quote).
fn string_end(text: &str, start: usize) -> Result<usize, ConfigSyntaxError> {
    let bytes = text.as_bytes();
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'\n' => break,
            b if b == quote => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(syntax_error(
        text,
        start,
        format!(
            "string literal is not closed (expected a closing {} on the same line)",
            quote as char
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inference::{
        model_config::SchedulingChoice, model_instance_group::Kind,
        model_queue_policy::TimeoutAction, model_version_policy::PolicyChoice, DataType,
    };

    fn parse(text: &str) -> ModelConfig {
        parse_model_config(text).unwrap_or_else(|e| panic!("{e:#}"))
    }

    fn parse_err(text: &str) -> String {
        format!("{:#}", parse_model_config(text).unwrap_err())
    }

    fn syntax_err(text: &str) -> ConfigSyntaxError {
        parse_model_config(text)
            .unwrap_err()
            .downcast::<ConfigSyntaxError>()
            .expect("a ConfigSyntaxError")
    }

    #[test]
    fn every_config_in_the_models_folder_parses() {
        let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
        let mut seen = 0;
        for entry in std::fs::read_dir(&models).unwrap() {
            let path = entry.unwrap().path().join("config.pbtxt");
            if !path.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let config =
                parse_model_config(&text).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            let folder = path
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap();
            assert_eq!(config.name, folder, "{}", path.display());
            assert!(!config.input.is_empty() && !config.output.is_empty());
            seen += 1;
        }
        assert!(seen > 0, "no config.pbtxt under {}", models.display());
    }

    #[test]
    fn colon_less_message_list_is_accepted() {
        let c = parse(r#"input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "b" } ]"#);
        assert_eq!(c.input.len(), 2);
        assert_eq!(c.input[1].name, "b");
    }

    #[test]
    fn colon_list_form_is_accepted() {
        let c = parse(r#"output: [ { name: "a" }, { name: "b" } ]"#);
        assert_eq!(c.output.len(), 2);
    }

    #[test]
    fn colon_less_scalar_list_is_accepted() {
        let c = parse(r#"input { name: "a" dims [ 2, -1 ] }"#);
        assert_eq!(c.input[0].dims, vec![2, -1]);
    }

    #[test]
    fn list_directly_after_field_name_without_space_is_accepted() {
        let c = parse(r#"input[{name:"a" dims[3]}]"#);
        assert_eq!(c.input[0].dims, vec![3]);
    }

    #[test]
    fn repeated_blocks_without_brackets_accumulate() {
        let c = parse("input { name: \"a\" }\ninput { name: \"b\" }\ninstance_group { count: 2 }");
        assert_eq!(c.input.len(), 2);
        assert_eq!(c.instance_group[0].count, 2);
    }

    #[test]
    fn brackets_and_hashes_inside_strings_are_left_alone() {
        let c = parse(
            r#"name: "m [ x" # a [ comment { with brackets
            default_model_filename: 'it\'s [#] "odd"'
            parameters { key: "p" value: { string_value: "a\"[b" } }"#,
        );
        assert_eq!(c.name, "m [ x");
        assert_eq!(c.default_model_filename, "it's [#] \"odd\"");
        assert_eq!(c.parameters["p"].string_value, "a\"[b");
    }

    #[test]
    fn comments_may_contain_unbalanced_brackets_and_quotes() {
        let c = parse("# input [ { \" \nmax_batch_size: 4 # } ] '\n");
        assert_eq!(c.max_batch_size, 4);
    }

    #[test]
    fn enum_names_are_parsed() {
        let c = parse(
            r#"input [ { name: "i" data_type: TYPE_INT32 format: FORMAT_NCHW dims: [ 3, 224, 224 ] } ]
            instance_group [ { count: 1 kind: KIND_CPU } ]"#,
        );
        assert_eq!(c.input[0].data_type, DataType::TypeInt32 as i32);
        assert_eq!(c.instance_group[0].kind, Kind::Cpu as i32);
    }

    #[test]
    fn dynamic_batching_with_priorities_and_queue_policies_parses() {
        let c = parse(
            r#"
            max_batch_size: 16
            dynamic_batching {
              preferred_batch_size: [ 4, 8 ]
              max_queue_delay_microseconds: 100
              preserve_ordering: false
              priority_levels: 2
              default_priority_level: 1
              default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 max_queue_size: 10 }
              priority_queue_policy [
                { key: 2 value: { timeout_action: REJECT allow_timeout_override: true } }
              ]
            }"#,
        );
        let Some(SchedulingChoice::DynamicBatching(d)) = c.scheduling_choice else {
            panic!("no dynamic batching")
        };
        assert_eq!(d.preferred_batch_size, vec![4, 8]);
        assert_eq!(d.max_queue_delay_microseconds, 100);
        assert_eq!(d.priority_levels, 2);
        let default = d.default_queue_policy.unwrap();
        assert_eq!(default.timeout_action, TimeoutAction::Delay as i32);
        assert_eq!(default.max_queue_size, 10);
        assert!(d.priority_queue_policy[&2].allow_timeout_override);
    }

    #[test]
    fn sequence_batching_with_control_inputs_parses() {
        let c = parse(
            r#"
            sequence_batching {
              max_sequence_idle_microseconds: 5000000
              control_input [
                {
                  name: "START"
                  control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ]
                },
                {
                  name: "CORRID"
                  control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ]
                }
              ]
              oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }
            }"#,
        );
        let Some(SchedulingChoice::SequenceBatching(s)) = c.scheduling_choice else {
            panic!("no sequence batching")
        };
        assert_eq!(s.control_input.len(), 2);
        assert_eq!(
            s.control_input[0].control[0].fp32_false_true,
            vec![0.0, 1.0]
        );
        assert_eq!(
            s.control_input[1].control[0].data_type,
            DataType::TypeUint64 as i32
        );
    }

    #[test]
    fn ensemble_steps_with_input_and_output_maps_parse() {
        let c = parse(
            r#"
            name: "ens"
            platform: "ensemble"
            max_batch_size: 8
            input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
            output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
            ensemble_scheduling {
              step [
                {
                  model_name: "pre"
                  model_version: -1
                  input_map { key: "PRE_IN" value: "IN" }
                  output_map { key: "PRE_OUT" value: "mid" }
                },
                {
                  model_name: "post"
                  model_version: -1
                  input_map [ { key: "POST_IN" value: "mid" } ]
                  output_map { key: "POST_OUT" value: "OUT" }
                }
              ]
            }"#,
        );
        let Some(SchedulingChoice::EnsembleScheduling(e)) = c.scheduling_choice else {
            panic!("no ensemble scheduling")
        };
        assert_eq!(e.step.len(), 2);
        assert_eq!(e.step[0].input_map["PRE_IN"], "IN");
        assert_eq!(e.step[1].input_map["POST_IN"], "mid");
        assert_eq!(e.step[1].model_version, -1);
    }

    #[test]
    fn parameters_map_parses() {
        let c = parse(
            r#"parameters { key: "execute_delay_ms" value: { string_value: "3" } }
            parameters: [ { key: "b", value { string_value: "x" } } ]"#,
        );
        assert_eq!(c.parameters["execute_delay_ms"].string_value, "3");
        assert_eq!(c.parameters["b"].string_value, "x");
    }

    #[test]
    fn version_policies_parse() {
        let latest = parse("version_policy: { latest: { num_versions: 2 } }");
        assert!(matches!(
            latest.version_policy.unwrap().policy_choice,
            Some(PolicyChoice::Latest(l)) if l.num_versions == 2
        ));
        let specific = parse("version_policy { specific { versions: [ 1, 3 ] } }");
        assert!(matches!(
            specific.version_policy.unwrap().policy_choice,
            Some(PolicyChoice::Specific(s)) if s.versions == vec![1, 3]
        ));
        let all = parse("version_policy: { all { } }");
        assert!(matches!(
            all.version_policy.unwrap().policy_choice,
            Some(PolicyChoice::All(_))
        ));
    }

    #[test]
    fn reshape_and_optional_parse() {
        let c = parse(
            r#"input [ { name: "x" data_type: TYPE_FP32 dims: [ 1, 16 ] reshape: { shape: [ 16 ] } optional: true } ]
            output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } label_filename: "labels.txt" } ]"#,
        );
        assert_eq!(c.input[0].reshape.as_ref().unwrap().shape, vec![16]);
        assert!(c.input[0].optional);
        assert_eq!(
            c.output[0].reshape.as_ref().unwrap().shape,
            Vec::<i64>::new()
        );
        assert_eq!(c.output[0].label_filename, "labels.txt");
    }

    #[test]
    fn angle_bracket_messages_and_separators_parse() {
        let c = parse("instance_group < count: 2; kind: KIND_CPU >, max_batch_size: 1;");
        assert_eq!(c.instance_group[0].count, 2);
        assert_eq!(c.max_batch_size, 1);
    }

    #[test]
    fn nested_colon_less_lists_parse() {
        let c = parse("optimization { execution_accelerators { cpu_execution_accelerator [ { name: \"openvino\" } ] } }");
        let acc = c.optimization.unwrap().execution_accelerators.unwrap();
        assert_eq!(acc.cpu_execution_accelerator[0].name, "openvino");
    }

    #[test]
    fn crlf_line_endings_and_a_byte_order_mark_are_accepted() {
        let c = parse("\u{feff}name: \"m\"\r\ninput [\r\n  { name: \"a\" }\r\n]\r\n");
        assert_eq!(c.input[0].name, "a");
        let e = syntax_err("\u{feff}name: \"m\"\r\nbogus: 1\r\n");
        assert_eq!((e.line, e.column), (2, 1), "{e}");
    }

    #[test]
    fn trailing_comma_in_a_list_is_reported_with_a_hint() {
        let e = syntax_err("input [ { name: \"a\" }, ]");
        assert_eq!((e.line, e.column), (1, 24), "{e}");
        assert!(e.message.contains("lists cannot end with a ','"), "{e}");
    }

    #[test]
    fn empty_text_is_an_empty_config() {
        assert_eq!(parse("  # nothing\n"), ModelConfig::default());
    }

    #[test]
    fn unknown_field_error_names_the_field_its_position_and_a_suggestion() {
        let e = syntax_err("name: \"m\"\ninput [\n  {\n    nmae: \"x\"\n  }\n]\n");
        assert_eq!((e.line, e.column), (4, 5), "{e}");
        assert!(e.message.contains("unknown field 'nmae'"), "{e}");
        assert!(e.message.contains("inference.ModelInput"), "{e}");
        assert!(e.message.contains("did you mean 'name'"), "{e}");
    }

    #[test]
    fn unknown_field_far_from_any_name_lists_the_known_fields() {
        let e = syntax_err("instance_group [ { zzzzzzzz: 1 } ]");
        assert!(e.message.contains("known fields: name, "), "{e}");
        // The inserted colon must not shift the column.
        assert_eq!((e.line, e.column), (1, 20), "{e}");
    }

    #[test]
    fn bad_enum_value_error_lists_the_valid_names() {
        let e = syntax_err("input [ { name: \"x\" data_type: TYPE_INT33 } ]");
        assert_eq!((e.line, e.column), (1, 32), "{e}");
        assert!(
            e.message
                .contains("'TYPE_INT33' is not a value of enum inference.DataType"),
            "{e}"
        );
        assert!(e.message.contains("TYPE_INT32"), "{e}");
    }

    #[test]
    fn unclosed_brace_points_at_the_opening_brace() {
        let e = syntax_err("name: \"m\"\ndynamic_batching {\n  max_queue_delay_microseconds: 10\n");
        assert_eq!((e.line, e.column), (2, 18), "{e}");
        assert!(e.message.contains("'{' is never closed"), "{e}");
    }

    #[test]
    fn mismatched_bracket_names_both_ends() {
        let e = syntax_err("input [\n  { name: \"a\"\n]\n");
        assert_eq!((e.line, e.column), (3, 1), "{e}");
        assert!(
            e.message
                .contains("does not close the '{' opened at line 2, column 3"),
            "{e}"
        );
    }

    #[test]
    fn stray_closing_brace_is_reported() {
        let e = syntax_err("max_batch_size: 1\n}\n");
        assert_eq!((e.line, e.column), (2, 1), "{e}");
        assert!(e.message.contains("closes nothing"), "{e}");
    }

    #[test]
    fn unterminated_string_is_reported_at_its_start() {
        let e = syntax_err("name: \"oops\nmax_batch_size: 1\n");
        assert_eq!((e.line, e.column), (1, 7), "{e}");
        assert!(e.message.contains("string literal is not closed"), "{e}");
    }

    #[test]
    fn missing_colon_before_a_scalar_is_reported_with_position() {
        let e = syntax_err("max_batch_size 8\n");
        assert_eq!((e.line, e.column), (1, 16), "{e}");
        assert!(
            e.message
                .contains("expected ':' between the field name and its value"),
            "{e}"
        );
    }

    #[test]
    fn wrong_value_type_is_reported_with_position() {
        let e = syntax_err("name: \"m\"\nmax_batch_size: \"eight\"\n");
        assert_eq!((e.line, e.column), (2, 17), "{e}");
    }

    #[test]
    fn out_of_range_integer_is_reported() {
        let e = parse_err("max_batch_size: 99999999999\n");
        assert!(e.contains("line 1, column 17"), "{e}");
        assert!(e.contains("out of range"), "{e}");
    }

    #[test]
    fn singular_field_set_twice_is_reported() {
        let e = parse_err("name: \"a\"\nname: \"b\"\n");
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("already set"), "{e}");
    }

    #[test]
    fn truncated_input_is_reported_at_the_end() {
        let e = syntax_err("name:");
        assert_eq!((e.line, e.column), (1, 6), "{e}");
        assert!(e.message.contains("end of input"), "{e}");
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        let e = syntax_err("name: \"é€\" bogus: 1");
        assert_eq!((e.line, e.column), (1, 12), "{e}");
    }

    #[test]
    fn text_output_parses_back_to_the_same_config() {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("models/simple_dyna_batch/config.pbtxt"),
        )
        .unwrap();
        let config = parse(&text);
        let printed = model_config_to_text(&config);
        assert_eq!(parse(&printed), config, "{printed}");
    }

    const REALISTIC: &str = r#"
        name: "ens" # trailing comment with [ and {
        platform: "ensemble"
        max_batch_size: 8
        version_policy: { specific { versions: [ 1, 3 ] } }
        input [ { name: "IN" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, -1, -1 ] reshape { shape: [ 3, -1, -1 ] } } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] label_filename: 'labels.txt' } ]
        ensemble_scheduling { step [ { model_name: "a" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } } ] }
        parameters { key: "execute_delay_ms" value: { string_value: "3" } }
        instance_group [ { count: 2, kind: KIND_CPU } ]
        optimization { priority: PRIORITY_MAX cuda { graphs: true } }
    "#;

    #[test]
    fn realistic_config_parses() {
        let c = parse(REALISTIC);
        assert_eq!(
            c.input[0].format,
            crate::proto::inference::model_input::Format::Nchw as i32
        );
        assert_eq!(c.instance_group[0].count, 2);
    }

    #[test]
    fn truncated_configs_give_errors_not_panics() {
        for (end, _) in REALISTIC.char_indices() {
            let _ = parse_model_config(&REALISTIC[..end]);
        }
    }

    #[test]
    fn mutated_configs_give_errors_not_panics() {
        const ALPHABET: &[u8] = b"{}[]<>:;,#'\"\\-.0123456789abz_ \n";
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let original = REALISTIC.as_bytes();
        for _ in 0..3000 {
            let mut bytes = original.to_vec();
            for _ in 0..1 + next() % 4 {
                let at = (next() % bytes.len() as u64) as usize;
                let with = ALPHABET[(next() % ALPHABET.len() as u64) as usize];
                match next() % 3 {
                    0 => bytes[at] = with,
                    1 => bytes.insert(at, with),
                    _ => {
                        bytes.remove(at);
                    }
                }
            }
            if let Ok(text) = String::from_utf8(bytes) {
                let _ = parse_model_config(&text);
            }
        }
    }

    #[test]
    fn original_offset_undoes_insertions() {
        let p = insert_list_colons("a [1] b [2]").unwrap();
        assert_eq!(p.text, "a: [1] b: [2]");
        assert_eq!(p.original_offset(3), 2);
        assert_eq!(p.original_offset(7), 6);
        assert_eq!(p.original_offset(10), 8);
    }
}
