use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::Context;

/// One model folder found in a repository.
#[derive(Debug, Clone)]
pub struct ModelDir {
    pub name: String,
    pub path: PathBuf,
}

/// Lists the models of every repository root. A name found in two roots
/// is an error for that model only (Triton refuses such duplicates);
/// `Err` values per name carry the reason.
pub fn scan_repositories(
    roots: &[PathBuf],
) -> anyhow::Result<BTreeMap<String, Result<ModelDir, String>>> {
    let mut found: BTreeMap<String, Result<ModelDir, String>> = BTreeMap::new();
    for root in roots {
        let entries = std::fs::read_dir(root)
            .with_context(|| format!("cannot read model repository {}", root.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot list {}", root.display()))?;
            let path = entry.path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            // A link that leads nowhere (dangling, or a loop) is reported
            // with the model's name rather than silently left out.
            if let Some(reason) = broken_link(&path) {
                found.entry(name).or_insert(Err(reason));
                continue;
            }
            if !path.is_dir() {
                continue;
            }
            match found.get(&name) {
                Some(Ok(prev)) => {
                    let reason = format!(
                        "model '{name}' appears in more than one repository: {} and {}",
                        prev.path.display(),
                        path.display()
                    );
                    found.insert(name, Err(reason));
                }
                Some(Err(_)) => {}
                None => {
                    found.insert(name.clone(), Ok(ModelDir { name, path }));
                }
            }
        }
    }
    Ok(found)
}

/// Why `path` is a symbolic link that cannot be followed (dangling, or
/// a loop such as a link to itself); `None` for anything else.
pub fn broken_link(path: &Path) -> Option<String> {
    let link = std::fs::symlink_metadata(path).ok()?;
    if !link.file_type().is_symlink() {
        return None;
    }
    let error = std::fs::metadata(path).err()?;
    let target = std::fs::read_link(path)
        .map(|t| format!(" -> {}", t.display()))
        .unwrap_or_default();
    Some(format!(
        "{}{target} is a symbolic link that cannot be followed: {error}",
        path.display()
    ))
}

/// Numbered version folders of a model, ascending. A numbered entry that
/// is a link that cannot be followed is listed too: loading that version
/// fails with the reason ([`broken_link`]) instead of the version
/// silently missing.
pub fn version_folders(model_dir: &Path) -> anyhow::Result<Vec<i64>> {
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(model_dir)
        .with_context(|| format!("cannot read {}", model_dir.display()))?
    {
        let path = entry?.path();
        if !path.is_dir() && broken_link(&path).is_none() {
            continue;
        }
        if let Some(v) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<i64>().ok())
        {
            if v >= 0 {
                versions.push(v);
            }
        }
    }
    versions.sort_unstable();
    Ok(versions)
}
