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
            if !path.is_dir() {
                continue;
            }
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

/// Numbered version folders of a model, ascending.
pub fn version_folders(model_dir: &Path) -> anyhow::Result<Vec<i64>> {
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(model_dir)
        .with_context(|| format!("cannot read {}", model_dir.display()))?
    {
        let path = entry?.path();
        if !path.is_dir() {
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
