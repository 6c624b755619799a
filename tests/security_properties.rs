//! Property tests (proptest, bounded cases) for the parsers and checks
//! the security work added: the restricted-API flags are operator input
//! and the endpoint classifiers and upload checks see client input, so
//! none may panic on anything, a parsed restriction must refuse a request
//! without its header and admit one with it, and an upload that starts
//! like a native binary is refused whatever its name and whatever the
//! Python opt-in says.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::{prelude::*, test_runner::Config};
use shardserve::{
    frontend::restricted::{
        grpc_category, http_category, Category, Protocol, Restrictions, GRPC_HEADER_PREFIX,
    },
    repository::uploads::check_files,
};

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// Pieces of a restricted-API flag: category names, separators and
/// near misses.
const FLAG_TOKENS: &[&str] = &[
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
    "Health",
    "repository",
    ",",
    ":",
    "=",
    " ",
    "key",
    "admin-key",
    "value",
    "",
    "\u{0}",
    "\n",
    "é",
];

fn flag_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(FLAG_TOKENS), 0..12).prop_map(|t| t.concat())
}

/// Path segments near the endpoints the HTTP routes serve.
const SEGMENTS: &[&str] = &[
    "v2",
    "models",
    "simple",
    "versions",
    "1",
    "infer",
    "generate",
    "generate_stream",
    "ready",
    "config",
    "stats",
    "trace",
    "setting",
    "health",
    "live",
    "logging",
    "repository",
    "index",
    "load",
    "unload",
    "systemsharedmemory",
    "cudasharedmemory",
    "region",
    "status",
    "register",
    "unregister",
    "",
    "..",
];

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn restricted_flags_parse_or_fail_without_panic(
        flags in prop::collection::vec(prop_oneof![flag_soup(), any::<String>()], 0..4),
        grpc in any::<bool>(),
    ) {
        let protocol = if grpc { Protocol::Grpc } else { Protocol::Http };
        if let Ok(parsed) = Restrictions::parse(protocol, &flags) {
            let _ = parsed.describe();
        }
    }

    #[test]
    fn a_parsed_restriction_refuses_without_its_header_and_admits_with_it(
        picked in prop::sample::subsequence(Category::ALL.to_vec(), 1..=Category::ALL.len()),
        key in "[a-z][a-z0-9-]{0,15}",
        value in "[A-Za-z0-9._~+/-]{1,32}",
        wrong in "[A-Za-z0-9._~+/-]{1,32}",
        grpc in any::<bool>(),
    ) {
        let protocol = if grpc { Protocol::Grpc } else { Protocol::Http };
        let names: Vec<&str> = picked.iter().map(|c| c.name()).collect();
        let flag = format!("{}:{key}={value}", names.join(","));
        let parsed = Restrictions::parse(protocol, std::slice::from_ref(&flag))
            .map_err(|e| TestCaseError::fail(format!("{flag}: {e}")))?;
        let header_name = if grpc { format!("{GRPC_HEADER_PREFIX}{key}") } else { key.clone() };
        let header = HeaderName::from_bytes(header_name.as_bytes())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let with = |v: &str| -> Result<HeaderMap, TestCaseError> {
            let mut h = HeaderMap::new();
            h.insert(
                header.clone(),
                HeaderValue::from_str(v).map_err(|e| TestCaseError::fail(e.to_string()))?,
            );
            Ok(h)
        };
        let right = with(&value)?;
        let other = with(&wrong)?;
        for category in Category::ALL {
            let restricted = picked.contains(&category);
            prop_assert_eq!(parsed.refuses(category, &HeaderMap::new()).is_some(), restricted);
            prop_assert!(parsed.refuses(category, &right).is_none());
            prop_assert_eq!(
                parsed.refuses(category, &other).is_some(),
                restricted && wrong != value
            );
        }
    }

    #[test]
    fn endpoint_classifiers_never_panic(
        segs in prop::collection::vec(
            prop_oneof![prop::sample::select(SEGMENTS).prop_map(str::to_string), any::<String>()],
            0..8,
        ),
        path in any::<String>(),
    ) {
        let refs: Vec<&str> = segs.iter().map(String::as_str).collect();
        let _ = http_category(&refs);
        let _ = grpc_category(&path);
        let _ = grpc_category(&format!("/inference.GRPCInferenceService/{path}"));
    }

    #[test]
    fn upload_checks_never_panic(
        files in prop::collection::vec((any::<String>(), prop::collection::vec(any::<u8>(), 0..64)), 0..6),
        allow_python in any::<bool>(),
    ) {
        let files: Vec<(String, Bytes)> =
            files.into_iter().map(|(n, d)| (n, Bytes::from(d))).collect();
        let _ = check_files(&files, allow_python);
    }

    #[test]
    fn an_elf_upload_is_refused_whatever_its_name(
        name in "[a-zA-Z0-9_./-]{1,40}",
        tail in prop::collection::vec(any::<u8>(), 0..64),
        allow_python in any::<bool>(),
    ) {
        let mut data = b"\x7fELF\x02\x01\x01\x00".to_vec();
        data.extend(tail);
        let refused = check_files(&[(name.clone(), Bytes::from(data))], allow_python);
        prop_assert!(refused.is_err(), "an ELF upload named {name:?} was accepted");
    }
}
