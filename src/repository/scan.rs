use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::Context;

/// One model folder found in a repository.
#[derive(Debug, Clone)]
pub struct ModelDir {
    /// The model's key in the model table: its folder name, or under
    /// `--model-namespacing`, for a name found in several repositories,
    /// [`namespaced_key`] (see [`key_name`]).
    pub name: String,
    pub path: PathBuf,
    /// Under `--model-namespacing`: the repository (as given on the
    /// command line) the model belongs to; `Some("")` for a model sent
    /// with its files in a load request.
    pub namespace: Option<Arc<str>>,
}

impl ModelDir {
    /// The model's own name (its folder's), without a namespace.
    pub fn model_name(&self) -> &str {
        key_name(&self.name)
    }
}

/// Triton's reason for a model folder name found in two or more
/// repositories (`MODEL_READY_REASON_DUPLICATE`): the repository index
/// shows it, and no copy loads.
pub const DUPLICATE: &str = "model appears in two or more repositories";

/// Separates a name from its namespace in the table key of a model whose
/// name several repositories hold (namespacing on). A folder name cannot
/// contain it, so such a key is never a model's plain name; it is
/// printable (keys name load threads and appear in logs).
const NAMESPACE_SEPARATOR: char = '/';

/// The table key of `name` in repository `namespace`, for a name found in
/// several repositories under `--model-namespacing`.
pub fn namespaced_key(name: &str, namespace: &str) -> String {
    format!("{name}{NAMESPACE_SEPARATOR}{namespace}")
}

/// The model name of a table key (the key itself unless namespaced).
pub fn key_name(key: &str) -> &str {
    key.split_once(NAMESPACE_SEPARATOR)
        .map_or(key, |(name, _)| name)
}

/// Whether `key` is the namespaced key of a name held by several
/// repositories.
pub fn is_namespaced_key(key: &str) -> bool {
    key.contains(NAMESPACE_SEPARATOR)
}

/// Where a folder name was found: its repository and path, or why a link
/// there cannot be followed.
type Place<'a> = Result<(&'a PathBuf, PathBuf), String>;

/// Lists the models of every repository root. Without namespacing, a name
/// found in two roots is an error for that model only (Triton refuses such
/// duplicates, with the reason [`DUPLICATE`]); with it (`namespacing`),
/// each copy is kept under its [`namespaced_key`]. `Err` values per name
/// carry the reason.
pub fn scan_repositories(
    roots: &[PathBuf],
    namespacing: bool,
) -> anyhow::Result<BTreeMap<String, Result<ModelDir, String>>> {
    // Per folder name, where it was found, in repository order (or why a
    // link there cannot be followed).
    let mut seen: BTreeMap<String, Vec<Place<'_>>> = BTreeMap::new();
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
                seen.entry(name).or_default().push(Err(reason));
                continue;
            }
            if !path.is_dir() {
                continue;
            }
            seen.entry(name).or_default().push(Ok((root, path)));
        }
    }
    let namespace = |root: &Path| -> Option<Arc<str>> {
        namespacing.then(|| Arc::from(root.display().to_string()))
    };
    let mut found = BTreeMap::new();
    for (name, places) in seen {
        let dirs: Vec<&(&PathBuf, PathBuf)> =
            places.iter().filter_map(|p| p.as_ref().ok()).collect();
        match (dirs.as_slice(), places.first()) {
            ([_, _, ..], _) if namespacing => {
                for (root, path) in &dirs {
                    let dir = ModelDir {
                        name: namespaced_key(&name, &root.display().to_string()),
                        path: path.clone(),
                        namespace: namespace(root.as_path()),
                    };
                    found.insert(dir.name.clone(), Ok(dir));
                }
            }
            ([_, _, ..], _) => {
                found.insert(name, Err(DUPLICATE.to_string()));
            }
            // A broken link met first wins over a folder of the same name
            // in a later repository.
            (_, Some(Err(reason))) => {
                found.insert(name, Err(reason.clone()));
            }
            ([(root, path)], _) => {
                let dir = ModelDir {
                    name: name.clone(),
                    path: path.clone(),
                    namespace: namespace(root.as_path()),
                };
                found.insert(name, Ok(dir));
            }
            _ => {}
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
