//! The Hugging Face cache layout (`huggingface_hub`'s, shared with mlx-lm and the `hf` CLI):
//! folder names, refs, snapshot links into `blobs/`, finding a cached model without the
//! network, and listing what the cache holds.

use std::fs;
use std::path::{Path, PathBuf};

use super::{is_gguf, RepoRef, INDEX};
use crate::error::{Error, Result};

/// `org/repo` → `models--org--repo`.
pub(super) fn repo_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// A temp name in `dir` no other process or thread uses: `.<name>.<pid>.<n>.tmp`.
fn temp_name(dir: &Path, name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!(".{}.{}.{n}.tmp", name.rsplit('/').next().unwrap_or(name), std::process::id()))
}

fn is_commit(rev: &str) -> bool {
    rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The commit `refs/<rev>` holds (a commit id names itself).
fn commit_of(repo_dir: &Path, rev: &str) -> Option<String> {
    if is_commit(rev) {
        return Some(rev.to_ascii_lowercase());
    }
    let sha = fs::read_to_string(repo_dir.join("refs").join(rev)).ok()?;
    let sha = sha.trim();
    is_commit(sha).then(|| sha.to_string())
}

/// Records that `rev` names `commit` (written whole: a temp file renamed over the old one).
pub(super) fn write_ref(repo_dir: &Path, rev: &str, commit: &str) -> Result<()> {
    let path = repo_dir.join("refs").join(rev);
    if fs::read_to_string(&path).is_ok_and(|s| s.trim() == commit) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(repo_dir);
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tmp = temp_name(dir, rev);
    fs::write(&tmp, commit).map_err(|e| Error::io(&tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(&path, e)
    })
}

/// Points `snapshot/<file>` at `blob` with a relative link (`../../blobs/<etag>`, one more `..`
/// per directory in `file`), as huggingface_hub does; a copy where links are not supported.
pub(super) fn link(snapshot: &Path, file: &str, blob: &Path) -> Result<()> {
    let dest = snapshot.join(file);
    let dir = dest.parent().unwrap_or(snapshot);
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tmp = temp_name(dir, file);
    #[cfg(unix)]
    {
        let depth = file.split('/').count() + 1; // snapshots/<commit>/<dirs...>
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(blob.file_name().unwrap_or_default());
        std::os::unix::fs::symlink(&target, &tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    #[cfg(not(unix))]
    fs::copy(blob, &tmp).map_err(|e| Error::io(&tmp, e))?;
    fs::rename(&tmp, &dest).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(&dest, e)
    })
}

/// The safetensors the snapshot needs are all there: the index's shards, or at least one file.
fn weights_complete(snapshot: &Path) -> bool {
    let index = snapshot.join(INDEX);
    if index.exists() {
        return super::index_shards(&index).is_ok_and(|shards| shards.iter().all(|s| snapshot.join(s).is_file()));
    }
    fs::read_dir(snapshot).is_ok_and(|rd| {
        rd.flatten().any(|e| e.file_name().to_string_lossy().ends_with(".safetensors") && e.path().is_file())
    })
}

/// GGUF files in a snapshot (top level and one directory down), as repo paths.
fn snapshot_ggufs(snapshot: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut visit = |dir: &Path, prefix: &str| {
        let Ok(rd) = fs::read_dir(dir) else { return Vec::new() };
        let mut subdirs = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_dir() {
                subdirs.push(name);
            } else if is_gguf(&name) && e.path().is_file() {
                out.push(format!("{prefix}{name}"));
            }
        }
        subdirs
    };
    for sub in visit(snapshot, "") {
        visit(&snapshot.join(&sub), &format!("{sub}/"));
    }
    out.sort();
    out
}

/// What the cache holds for `r`, without the network: the snapshot of the commit `r`'s
/// revision names (a commit id, or `refs/<revision>`), when it is complete enough to load.
pub(super) fn find(repo_dir: &Path, r: &RepoRef) -> Option<PathBuf> {
    let commit = commit_of(repo_dir, r.revision())?;
    let snapshot = repo_dir.join("snapshots").join(commit);
    if !snapshot.is_dir() {
        return None;
    }
    let ggufs = snapshot_ggufs(&snapshot);
    if r.file.is_some() || !snapshot.join("config.json").is_file() {
        return match &r.file {
            Some(tag) => super::gguf_for_tag(r, tag, &ggufs).ok().map(|f| snapshot.join(f)),
            None => match super::model_ggufs(&ggufs).as_slice() {
                [one] => Some(snapshot.join(one)),
                _ => None,
            },
        };
    }
    weights_complete(&snapshot).then_some(snapshot)
}

/// A model in the Hugging Face cache, as `weft ls` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedModel {
    /// What `--model` takes to load it: `org/repo`, `org/repo@rev`, or with `:file` for GGUF.
    pub name: String,
    /// The snapshot directory, or the GGUF file.
    pub path: PathBuf,
}

/// The models the cache at `cache_dir` holds in loadable shape: per repo, each ref's snapshot
/// (and each snapshot no ref names, by commit); a snapshot with several GGUF files once per file.
pub fn cached_models(cache_dir: &Path) -> Vec<CachedModel> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(cache_dir) else { return out };
    let mut repos: Vec<(String, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix("models--")?;
            let (owner, repo) = rest.split_once("--")?;
            Some((format!("{owner}/{}", repo.replace("--", "/")), e.path()))
        })
        .collect();
    repos.sort();
    for (repo, dir) in repos {
        let mut refs: Vec<(String, String)> = Vec::new(); // (name suffix, commit)
        collect_refs(&dir.join("refs"), "", &mut refs);
        refs.sort_by_key(|(name, _)| (name != "main", name.clone()));
        let mut seen: Vec<String> = Vec::new();
        let mut snapshots: Vec<String> = fs::read_dir(dir.join("snapshots"))
            .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        snapshots.sort();
        let unnamed = snapshots.into_iter().filter(|c| !refs.iter().any(|(_, rc)| rc == c)).map(|c| (c.clone(), c));
        for (rev, commit) in refs.clone().into_iter().chain(unnamed) {
            if seen.contains(&commit) {
                continue;
            }
            seen.push(commit.clone());
            let base = if rev == "main" { repo.clone() } else { format!("{repo}@{rev}") };
            let snapshot = dir.join("snapshots").join(&commit);
            if snapshot.join("config.json").is_file() {
                if weights_complete(&snapshot) {
                    out.push(CachedModel { name: base, path: snapshot });
                }
                continue;
            }
            let ggufs = snapshot_ggufs(&snapshot);
            let models = super::model_ggufs(&ggufs);
            for f in &models {
                let name = if models.len() == 1 { base.clone() } else { format!("{base}:{f}") };
                out.push(CachedModel { name, path: snapshot.join(f) });
            }
        }
    }
    out
}

fn collect_refs(dir: &Path, prefix: &str, out: &mut Vec<(String, String)>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = format!("{prefix}{}", e.file_name().to_string_lossy());
        if name.starts_with('.') {
            continue;
        }
        if e.path().is_dir() {
            collect_refs(&e.path(), &format!("{name}/"), out);
        } else if let Ok(sha) = fs::read_to_string(e.path()) {
            if is_commit(sha.trim()) {
                out.push((name, sha.trim().to_string()));
            }
        }
    }
}
