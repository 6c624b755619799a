//! Where lines go: standard error, or a file opened for appending (as
//! tritonserver 2.51 opens `--log-file`, so a restart keeps the old lines).

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    path::{Path, PathBuf},
};

use anyhow::Context as _;

#[derive(Debug)]
pub enum Sink {
    Stderr,
    File { path: PathBuf, file: File },
}

impl Sink {
    pub fn open(path: Option<&Path>) -> anyhow::Result<Self> {
        let Some(path) = path else {
            return Ok(Self::Stderr);
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open the log file '{}'", path.display()))?;
        Ok(Self::File {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::Stderr => None,
            Self::File { path, .. } => Some(path),
        }
    }

    /// One whole line in one `write` where the system allows it, so lines
    /// of different threads never interleave (the caller holds the lock).
    pub fn write_line(&mut self, line: &str) -> io::Result<()> {
        match self {
            Self::Stderr => io::stderr().lock().write_all(line.as_bytes()),
            Self::File { file, .. } => file.write_all(line.as_bytes()),
        }
    }
}
