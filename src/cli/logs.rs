//! The logging flags, collected in the shape of `crate::logs::LogSettings`
//! (written in parallel, see the logging part of issue 23): a stand-in until
//! the two are joined, so the command line already parses and checks them.

use std::path::PathBuf;

/// `--log-format`: tritonserver's two formats, and JSON lines (ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Default,
    Iso8601,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    /// tritonserver's spellings, case as it takes them.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(Self::Default),
            "ISO8601" => Ok(Self::Iso8601),
            "json" => Ok(Self::Json),
            _ => Err("expected default, ISO8601 or json".into()),
        }
    }
}

/// What the logging flags asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    pub verbose: u32,
    pub info: bool,
    pub warning: bool,
    pub error: bool,
    pub format: LogFormat,
    pub file: Option<PathBuf>,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            verbose: 0,
            info: true,
            warning: true,
            error: true,
            format: LogFormat::Default,
            file: None,
        }
    }
}
