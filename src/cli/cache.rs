//! The response cache flags: `--cache-config <cache>,<setting>=<value>`,
//! the deprecated `--response-cache-byte-size` and `--cache-directory`.
//! Only Triton's `local` cache exists here, built in: another cache name
//! fails start-up as tritonserver does when it finds no library for it.

use super::args::{CacheArgs, DeprecatedArgs};

/// Where tritonserver looks for cache libraries without `--cache-directory`.
const DEFAULT_CACHE_DIRECTORY: &str = "/opt/tritonserver/caches";

/// The local cache's byte size the flags ask for; `None` without a cache.
/// Errors carry tritonserver's words (`error: ` is added by the caller).
pub fn local_cache_bytes(
    cache: &CacheArgs,
    deprecated: &DeprecatedArgs,
) -> anyhow::Result<Option<u64>> {
    if let Some(bytes) = deprecated.response_cache_byte_size {
        if !cache.cache_config.is_empty() {
            anyhow::bail!(
                "Incompatible flags --response-cache-byte-size and --cache-config both provided. Please provide one or the other."
            );
        }
        return Ok(Some(bytes));
    }
    let Some((name, _, _)) = cache.cache_config.first() else {
        return Ok(None);
    };
    if cache.cache_config.iter().any(|(n, _, _)| n != name) {
        anyhow::bail!(
            "creating server: Invalid argument - found multiple cache configurations, but only a single cache is currently supported"
        );
    }
    if name != "local" {
        let dir = cache
            .cache_directory
            .as_ref()
            .map_or(DEFAULT_CACHE_DIRECTORY.to_string(), |d| {
                d.display().to_string()
            });
        anyhow::bail!(
            "creating server: Invalid argument - unable to find 'libtritoncache_{name}.so' for cache. Searched: {dir} (shardserve has only the built-in 'local' cache)"
        );
    }
    let mut size = None;
    for (_, setting, value) in &cache.cache_config {
        match setting.as_str() {
            "size" => {
                size = Some(value.trim().parse::<u64>().map_err(|_| {
                    anyhow::anyhow!(
                        "creating server: Invalid argument - failed to parse the 'local' cache config: size '{value}' is not a byte count (a non-negative integer)"
                    )
                })?)
            }
            other => anyhow::bail!(
                "creating server: Invalid argument - unknown setting '{other}' in the 'local' cache config (it takes: size)"
            ),
        }
    }
    match size {
        Some(bytes) => Ok(Some(bytes)),
        None => anyhow::bail!(
            "creating server: Invalid argument - the 'local' cache config needs a size: --cache-config local,size=<bytes>"
        ),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::args::Cli;
    use super::*;

    fn bytes(flags: &[&str]) -> anyhow::Result<Option<u64>> {
        let mut argv = vec!["tritonserver", "--model-repository", "/m"];
        argv.extend_from_slice(flags);
        let cli = Cli::try_parse_from(argv).expect("parses");
        local_cache_bytes(&cli.cache, &cli.deprecated)
    }

    fn error(flags: &[&str]) -> String {
        format!("{:#}", bytes(flags).expect_err("refused"))
    }

    #[test]
    fn the_local_cache_size() {
        assert_eq!(bytes(&[]).expect("ok"), None);
        assert_eq!(
            bytes(&["--cache-config", "local,size=1048576"]).expect("ok"),
            Some(1_048_576)
        );
        assert_eq!(
            bytes(&["--response-cache-byte-size", "8192"]).expect("ok"),
            Some(8192)
        );
        assert_eq!(
            bytes(&[
                "--cache-config",
                "local,size=10",
                "--cache-directory",
                "/opt/c"
            ])
            .expect("ok"),
            Some(10)
        );
    }

    #[test]
    fn bad_cache_settings_are_refused_with_triton_words() {
        assert!(error(&["--cache-config", "local,size=abc"]).contains("size 'abc'"));
        assert!(error(&["--cache-config", "local,size=-5"]).contains("size '-5'"));
        assert!(error(&["--cache-config", "local,foo=1"]).contains("unknown setting 'foo'"));
        assert!(error(&["--cache-config", "redis,host=x"])
            .contains("unable to find 'libtritoncache_redis.so' for cache. Searched: /opt/tritonserver/caches"));
        assert!(
            error(&["--cache-config", "redis,host=x", "--cache-directory", "/c"])
                .contains("Searched: /c")
        );
        assert!(error(&[
            "--cache-config",
            "local,size=1",
            "--cache-config",
            "redis,key=value"
        ])
        .contains("multiple cache configurations"));
        assert!(error(&[
            "--response-cache-byte-size",
            "12345",
            "--cache-config",
            "local,size=67890"
        ])
        .contains("Incompatible flags"));
    }
}
