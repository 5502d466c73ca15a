//! Models named by Hugging Face Hub repo id: `org/repo[@revision][:file]`.
//!
//! [`ensure`] resolves the revision through the Hub's HTTP API
//! (`{endpoint}/api/models/{repo}/revision/{rev}`: the commit and the file list), picks what
//! loading needs ([`select`]: config, tokenizer and chat-template files, processor configs, the
//! safetensors shards the index names; or one GGUF file), and downloads each missing file from
//! `{endpoint}/{repo}/resolve/{commit}/{file}` into the cache layout `huggingface_hub` uses
//! ([`cache`]), so mlx-lm, the `hf` CLI and Weft share one copy of every file:
//!
//! ```text
//! <cache>/models--org--repo/blobs/<etag>                 file contents (sha256 for LFS files)
//! <cache>/models--org--repo/snapshots/<commit>/<file>    -> ../../blobs/<etag>
//! <cache>/models--org--repo/refs/<revision>              the commit the revision names
//! <cache>/.locks/models--org--repo/<etag>.lock           one download of a blob at a time
//! ```
//!
//! A file already in the snapshot is not asked about again, so a second run costs one API call
//! and downloads nothing. A blob is downloaded into `blobs/<etag>.incomplete` under its lock
//! (the lock file `huggingface_hub` takes too), resumed with a `Range` request by whichever
//! process comes next, checked (size, and the sha256 an LFS file's etag is), and renamed into
//! place; a cancelled or failed download never leaves a file under a name that loads.
//!
//! Offline ([`HubOptions::offline`], `HF_HUB_OFFLINE=1`) only the cache is read; an unreachable
//! Hub falls back to the cache too. The options are values: the faces fill them from
//! `HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE`, `HF_HUB_CACHE`, `HF_HOME` through
//! [`HubOptions::from_env`] (which has [`crate::env::hub_vars`] read them).

mod api;
mod cache;

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use super::download::{download_resumable, http_agent, tls_hint, Failed, Transfer};
use super::lock::DirLock;
use super::progress::{Phase, Progress, Reporter};
use crate::error::{Error, Result};

pub use cache::{cached_models, CachedModel};

use api::{ApiError, FileMeta};

/// Where and how Hub models are fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubOptions {
    /// The Hub's base URL, without a trailing slash (`https://huggingface.co`).
    pub endpoint: String,
    /// Sent as `Authorization: Bearer` to the Hub (gated and private repos).
    pub token: Option<String>,
    /// Read the cache only; never touch the network.
    pub offline: bool,
    /// The hub cache directory (`~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
}

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

impl HubOptions {
    /// The public Hub, online, caching in `cache_dir`.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Self {
        HubOptions { endpoint: DEFAULT_ENDPOINT.into(), token: None, offline: false, cache_dir: cache_dir.into() }
    }

    /// The options the Hugging Face variables set, as `huggingface_hub` reads them
    /// ([`crate::env::hub_vars`]: `HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE`, `HF_HUB_CACHE`,
    /// `HF_HOME`). A face calls this for a model its caller named by repo id.
    pub fn from_env() -> Result<Self> {
        let v = crate::env::hub_vars()?;
        Ok(HubOptions {
            endpoint: v.endpoint.unwrap_or_else(|| DEFAULT_ENDPOINT.into()),
            token: v.token,
            offline: v.offline,
            cache_dir: v.cache_dir,
        })
    }
}

/// A model named on the Hub: `org/repo`, an optional `@revision` (branch, tag or commit; default
/// `main`) and an optional `:file` (a GGUF file in the repo, or a quantization tag such as
/// `Q4_K_M` that names one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    pub repo: String,
    pub revision: Option<String>,
    pub file: Option<String>,
}

impl RepoRef {
    /// `None` unless `s` has the shape of a repo id: `owner/name` (letters, digits, `-`, `_`,
    /// `.`; not starting with `.` or `-`), then optionally `@revision` and `:file`.
    pub fn parse(s: &str) -> Option<RepoRef> {
        let (rest, file) = match s.split_once(':') {
            Some((r, f)) if !f.is_empty() && !f.starts_with('/') && !f.split('/').any(|p| p == "..") => {
                (r, Some(f.to_string()))
            }
            Some(_) => return None,
            None => (s, None),
        };
        let (repo, revision) = match rest.split_once('@') {
            Some((r, rev)) if !rev.is_empty() && !rev.split('/').any(|p| p.is_empty() || p == "." || p == "..") => {
                (r, Some(rev.to_string()))
            }
            Some(_) => return None,
            None => (rest, None),
        };
        let (owner, name) = repo.split_once('/')?;
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.len() <= 96
                && !p.starts_with(['.', '-'])
                && !p.contains("..")
                && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        (part_ok(owner) && part_ok(name)).then(|| RepoRef { repo: repo.to_string(), revision, file })
    }

    /// The revision asked for (`main` when none was).
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }
}

impl fmt::Display for RepoRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.repo)?;
        if let Some(rev) = &self.revision {
            write!(f, "@{rev}")?;
        }
        if let Some(file) = &self.file {
            write!(f, ":{file}")?;
        }
        Ok(())
    }
}

/// Top-level files loading reads when the repo has them (the weights come from the index).
const SUPPORT_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "model.safetensors.index.json",
];

const INDEX: &str = "model.safetensors.index.json";

/// What to download from a repo.
#[derive(Debug, PartialEq, Eq)]
enum Selection {
    /// An mlx-lm / transformers directory: these files, then the shards the index names (when
    /// it is among them).
    Dir(Vec<String>),
    /// One GGUF file.
    File(String),
}

fn is_gguf(f: &str) -> bool {
    f.to_ascii_lowercase().ends_with(".gguf")
}

/// GGUF files that hold a model (not a vision projector).
fn model_ggufs<'a>(files: &'a [String]) -> Vec<&'a String> {
    files.iter().filter(|f| is_gguf(f) && !f.to_ascii_lowercase().contains("mmproj")).collect()
}

/// The one GGUF file `tag` names: its path, its file name, or a quantization tag in its name.
fn gguf_for_tag<'a>(r: &RepoRef, tag: &str, files: &'a [String]) -> Result<&'a String> {
    if let Some(f) = files.iter().find(|f| *f == tag || f.rsplit('/').next() == Some(tag)) {
        return Ok(f);
    }
    let want = tag.to_ascii_lowercase();
    let hits: Vec<&String> = model_ggufs(files)
        .into_iter()
        .filter(|f| {
            let name = f.rsplit('/').next().unwrap_or(f).to_ascii_lowercase();
            // A tag matches between separators: `Q4_K` must not pick `Q4_K_M`.
            name.match_indices(&want).any(|(i, _)| {
                let before = name[..i].chars().next_back();
                let after = name[i + want.len()..].chars().next();
                before.is_none_or(|c| matches!(c, '-' | '.' | '_'))
                    && after.is_none_or(|c| matches!(c, '-' | '.'))
            })
        })
        .collect();
    match hits.as_slice() {
        [one] => Ok(one),
        [] => Err(Error::Download(format!("{r}: the repo has no file {tag:?} and no GGUF file tagged {tag}; {}", list_ggufs(files)))),
        many => Err(Error::Download(format!(
            "{r}: {tag} matches several files ({}); name one as {}:FILE",
            many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            r.repo
        ))),
    }
}

fn list_ggufs(files: &[String]) -> String {
    let g = model_ggufs(files);
    if g.is_empty() {
        "it holds no GGUF files".into()
    } else {
        format!("its GGUF files: {}", g.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))
    }
}

/// Picks what to download from the repo's file list.
fn select(r: &RepoRef, files: &[String]) -> Result<Selection> {
    if let Some(tag) = &r.file {
        return gguf_for_tag(r, tag, files).map(|f| Selection::File(f.clone()));
    }
    if files.iter().any(|f| f == "config.json") {
        let mut want: Vec<String> = SUPPORT_FILES.iter().filter(|s| files.iter().any(|f| f == *s)).map(|s| s.to_string()).collect();
        if !files.iter().any(|f| f == INDEX) {
            let weights: Vec<String> = files.iter().filter(|f| !f.contains('/') && f.ends_with(".safetensors")).cloned().collect();
            if weights.is_empty() {
                return Err(Error::Download(format!(
                    "{r}: the repo has a config.json but no safetensors weights (Weft loads safetensors \
                     checkpoints, as mlx-lm converts them, and GGUF files)"
                )));
            }
            want.extend(weights);
        }
        return Ok(Selection::Dir(want));
    }
    match model_ggufs(files).as_slice() {
        [one] => Ok(Selection::File((*one).clone())),
        [] => Err(Error::Download(format!(
            "{r}: the repo has neither a config.json (an mlx-lm / transformers model) nor a GGUF file"
        ))),
        _ => Err(Error::Download(format!(
            "{r}: the repo holds several GGUF files; name one as {repo}:FILE or {repo}:QUANT (e.g. {repo}:Q4_K_M); {}",
            list_ggufs(files),
            repo = r.repo
        ))),
    }
}

/// The shards `model.safetensors.index.json` names, in order, once each.
fn index_shards(index: &Path) -> Result<Vec<String>> {
    let text = fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::Download(format!("{}: not JSON: {e}", index.display())))?;
    let map = json["weight_map"]
        .as_object()
        .ok_or_else(|| Error::Download(format!("{}: no weight_map", index.display())))?;
    let mut shards: Vec<String> = Vec::new();
    for v in map.values() {
        let s = v.as_str().ok_or_else(|| Error::Download(format!("{}: a weight_map value is not a string", index.display())))?;
        if s.starts_with('/') || s.split('/').any(|p| p == "..") {
            return Err(Error::Download(format!("{}: shard path {s:?} leaves the repo", index.display())));
        }
        if !shards.iter().any(|x| x == s) {
            shards.push(s.to_string());
        }
    }
    Ok(shards)
}

/// The local path of `r`: the snapshot directory of an mlx-lm / transformers repo, or the GGUF
/// file; downloading what the cache lacks. `progress` hears about downloads (aggregated over
/// the files of one batch); setting `cancel` stops a download (what it received is kept for
/// resuming, under a name that never loads).
pub fn ensure(
    opts: &HubOptions,
    r: &RepoRef,
    progress: &mut dyn FnMut(Progress),
    cancel: &AtomicBool,
) -> Result<PathBuf> {
    let repo_dir = opts.cache_dir.join(cache::repo_folder(&r.repo));
    if opts.offline {
        return cache::find(&repo_dir, r).ok_or_else(|| {
            Error::Download(format!(
                "{r} is not in the Hugging Face cache {} and HF_HUB_OFFLINE is set; \
                 download it once online (`weft pull {r}`) or unset HF_HUB_OFFLINE",
                opts.cache_dir.display()
            ))
        });
    }
    let agent = http_agent();
    let info = match api::revision_info(&agent, opts, r) {
        Ok(info) => info,
        Err(ApiError::Unreachable(msg)) => {
            // As huggingface_hub does: no Hub, but a cached copy of this revision, is fine.
            if let Some(p) = cache::find(&repo_dir, r) {
                return Ok(p);
            }
            return Err(Error::Download(format!(
                "cannot reach the Hugging Face Hub at {} to fetch {r}: {msg}{}. Check the network \
                 (and HF_ENDPOINT); {r} is not in the cache {} for offline use",
                opts.endpoint,
                tls_hint(&msg),
                opts.cache_dir.display()
            )));
        }
        Err(ApiError::Fatal(e)) => return Err(e),
    };
    let mut rep = Reporter::new(progress);
    let snapshot = repo_dir.join("snapshots").join(&info.sha);
    let fetch = |files: &[String], rep: &mut Reporter| fetch_files(&agent, opts, r, &repo_dir, &info.sha, files, rep, cancel);
    let path = match select(r, &info.files)? {
        Selection::File(f) => {
            fetch(std::slice::from_ref(&f), &mut rep)?;
            snapshot.join(f)
        }
        Selection::Dir(files) => {
            fetch(&files, &mut rep)?;
            if files.iter().any(|f| f == INDEX) {
                let shards = index_shards(&snapshot.join(INDEX))?;
                if let Some(missing) = shards.iter().find(|s| !info.files.contains(s)) {
                    return Err(Error::Download(format!("{r}: {INDEX} names {missing}, which the repo does not hold")));
                }
                fetch(&shards, &mut rep)?;
            }
            snapshot
        }
    };
    if r.revision() != info.sha {
        cache::write_ref(&repo_dir, r.revision(), &info.sha)?;
    }
    rep.force(Progress { downloaded: 0, total: None, phase: Phase::Done });
    Ok(path)
}

/// Downloads the `files` of `commit` the snapshot lacks and links them into it.
#[allow(clippy::too_many_arguments)]
fn fetch_files(
    agent: &ureq::Agent,
    opts: &HubOptions,
    r: &RepoRef,
    repo_dir: &Path,
    commit: &str,
    files: &[String],
    rep: &mut Reporter,
    cancel: &AtomicBool,
) -> Result<()> {
    let snapshot = repo_dir.join("snapshots").join(commit);
    let blobs = repo_dir.join("blobs");
    if let Some(bad) = files.iter().find(|f| f.starts_with('/') || f.contains('\\') || f.split('/').any(|p| p.is_empty() || p == "." || p == "..")) {
        return Err(Error::Download(format!("{r}: the Hub lists a file {bad:?} whose path leaves the repo")));
    }
    // A snapshot entry whose blob is there (the link resolves) is done: no request for it.
    let missing: Vec<&String> = files.iter().filter(|f| !snapshot.join(f).is_file()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut metas: Vec<(&String, FileMeta)> = Vec::with_capacity(missing.len());
    for f in missing {
        metas.push((f, api::file_meta(agent, opts, r, commit, f).map_err(ApiError::into_error)?));
    }
    let have = |m: &FileMeta| fs::metadata(blobs.join(&m.etag)).is_ok_and(|md| md.is_file() && md.len() == m.size);
    let total: u64 = metas.iter().filter(|(_, m)| !have(m)).map(|(_, m)| m.size).sum();
    let mut offset = 0;
    fs::create_dir_all(&blobs).map_err(|e| Error::io(&blobs, e))?;
    let locks = opts.cache_dir.join(".locks").join(cache::repo_folder(&r.repo));
    fs::create_dir_all(&locks).map_err(|e| Error::io(&locks, e))?;
    for (file, meta) in &metas {
        if !have(meta) {
            // Held while this blob is written; another process (Weft or huggingface_hub)
            // downloading it waits, then finds it.
            let _lock = DirLock::acquire(&locks.join(format!("{}.lock", meta.etag)), rep)?;
            if !have(meta) {
                download_blob(agent, opts, r, file, meta, &blobs, offset, total, rep, cancel)?;
            }
            offset += meta.size;
        }
        cache::link(&snapshot, file, &blobs.join(&meta.etag))?;
    }
    Ok(())
}

/// Streams one blob into `blobs/<etag>.incomplete` (resuming what is there), checks it and
/// renames it to `blobs/<etag>`. Called under the blob's lock.
#[allow(clippy::too_many_arguments)]
fn download_blob(
    agent: &ureq::Agent,
    opts: &HubOptions,
    r: &RepoRef,
    file: &str,
    meta: &FileMeta,
    blobs: &Path,
    offset: u64,
    total: u64,
    rep: &mut Reporter,
    cancel: &AtomicBool,
) -> Result<()> {
    let part = blobs.join(format!("{}.incomplete", meta.etag));
    let t = Transfer {
        url: &meta.url,
        name: file,
        expected: meta.size,
        bearer: opts.token.as_deref(),
        cancel,
        offset,
        total,
    };
    let hash = match download_resumable(agent, &t, &part, rep) {
        Ok(hash) => hash,
        Err(Failed::Error(e)) => return Err(e),
        Err(Failed::Cancelled) => return Err(Error::Download(format!("download of {r} cancelled"))),
        Err(Failed::Status(status)) => {
            return Err(Error::Download(format!("GET {}: HTTP {status} while downloading {file} of {r}", meta.url)))
        }
        Err(Failed::Exhausted(msg)) => {
            let got = fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
            return Err(Error::Download(format!(
                "downloading {file} of {r} failed ({got} of {} bytes received, kept for resuming): {msg}{}",
                meta.size,
                tls_hint(&msg)
            )));
        }
    };
    // An LFS file's etag is its sha256; a plain git file's is a git object id (size checked).
    if meta.is_sha256() && !hash.eq_ignore_ascii_case(&meta.etag) {
        let _ = fs::remove_file(&part);
        return Err(Error::Download(format!(
            "{file} of {r} failed verification: the Hub names sha256 {}, the {} bytes received hash to {hash} (deleted; run again)",
            meta.etag, meta.size
        )));
    }
    let blob = blobs.join(&meta.etag);
    fs::rename(&part, &blob).map_err(|e| Error::io(&blob, e))?;
    super::temp_file::sync_dir(blobs);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> RepoRef {
        RepoRef::parse(s).unwrap()
    }

    #[test]
    fn repo_ids_parse() {
        assert_eq!(r("org/repo"), RepoRef { repo: "org/repo".into(), revision: None, file: None });
        assert_eq!(r("mlx-community/Qwen3.5-4B-4bit@v1.0").revision.as_deref(), Some("v1.0"));
        let g = r("unsloth/gemma-3-270m-it-GGUF@main:Q4_K_M");
        assert_eq!((g.revision.as_deref(), g.file.as_deref()), (Some("main"), Some("Q4_K_M")));
        assert_eq!(r("o/r:sub/f.gguf").file.as_deref(), Some("sub/f.gguf"));
        assert_eq!(r("o/r@refs/pr/1").revision.as_deref(), Some("refs/pr/1"));
        assert_eq!(r("o/r@v1:F.gguf").to_string(), "o/r@v1:F.gguf");
        for bad in ["repo", "a/b/c", "./x", "../a/b", "/abs/path", "o/r@", "o/r:", "o/.r", "o/r@../x", "o/r:../f", "o/r x", "a//b", "C:\\x\\y"] {
            assert_eq!(RepoRef::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn selection_picks_what_loading_needs() {
        let files = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mlx = files(&["config.json", "README.md", "tokenizer.json", "model.safetensors", "extra/x.safetensors", ".gitattributes"]);
        assert_eq!(
            select(&r("o/r"), &mlx).unwrap(),
            Selection::Dir(files(&["config.json", "tokenizer.json", "model.safetensors"]))
        );
        let sharded = files(&["config.json", INDEX, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
        assert_eq!(select(&r("o/r"), &sharded).unwrap(), Selection::Dir(files(&["config.json", INDEX])));
        let gguf = files(&["README.md", "m-Q4_K_M.gguf", "m-Q4_K.gguf", "m-Q8_0.gguf", "mmproj-F16.gguf"]);
        assert_eq!(select(&r("o/r:Q4_K_M"), &gguf).unwrap(), Selection::File("m-Q4_K_M.gguf".into()));
        assert_eq!(select(&r("o/r:q4_k"), &gguf).unwrap(), Selection::File("m-Q4_K.gguf".into()));
        assert_eq!(select(&r("o/r:m-Q8_0.gguf"), &gguf).unwrap(), Selection::File("m-Q8_0.gguf".into()));
        let e = select(&r("o/r"), &gguf).unwrap_err().to_string();
        assert!(e.contains("several GGUF files") && e.contains("o/r:Q4_K_M") && !e.contains("mmproj"), "{e}");
        let e = select(&r("o/r:Q2_K"), &gguf).unwrap_err().to_string();
        assert!(e.contains("no GGUF file tagged Q2_K") && e.contains("m-Q8_0.gguf"), "{e}");
        assert_eq!(select(&r("o/r"), &files(&["a.gguf", "mmproj.gguf"])).unwrap(), Selection::File("a.gguf".into()));
        assert!(select(&r("o/r"), &files(&["README.md"])).unwrap_err().to_string().contains("neither a config.json"));
        let torch = files(&["config.json", "pytorch_model.bin"]);
        assert!(select(&r("o/r"), &torch).unwrap_err().to_string().contains("no safetensors weights"));
    }
}
