//! Saving one prompt-cache entry to a file and loading it back into a running engine, so a
//! fixed preamble is prefilled once, ever ([`Engine::save_prompt_cache_entry`],
//! [`Engine::load_prompt_cache_entry`]; the file format is [`super::prompt_cache_file`]).
//!
//! The cache lives on the driver thread: both run there, between two steps, through a
//! [`Command::Core`] whose reply comes back on a channel. Rows running meanwhile wait for the
//! file's write or read.

use std::path::Path;
use std::sync::mpsc;

use super::{Command, Engine, EngineCore, Front, Request, Submitter};
use crate::{Error, Result};

/// What a save wrote or a load read: the tokens the entry holds and the file's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SavedEntryInfo {
    pub tokens: usize,
    pub bytes: u64,
}

/// Work run on the driver thread with the engine's core.
pub(super) type CoreTask = Box<dyn FnOnce(&mut EngineCore) + Send>;

impl Engine {
    /// Writes one prompt-cache entry to `path`: the cached prefix a request with `prompt`'s
    /// input would reuse (its messages rendered with its tools and template variables as a
    /// request's are, its text or its token ids; the rest of the request is ignored), or with
    /// no prompt the most recently used entry (after a request, its prompt and answer).
    /// `Ok(None)` when the cache holds nothing for it. Refused when the prompt cache is off.
    pub fn save_prompt_cache_entry(&self, prompt: Option<Request>, path: &Path) -> Result<Option<SavedEntryInfo>> {
        self.front.save_entry(prompt, path)
    }

    /// Reads an entry [`Engine::save_prompt_cache_entry`] wrote into the prompt cache: later
    /// requests whose prompts start with its tokens reuse it. A file saved for another model,
    /// tokenizer or kernel mode, or truncated or corrupt, is refused with why; one larger than
    /// the cache's capacity with [`Error::Capacity`]. Entries give way to running rows under
    /// the one memory ceiling, as any entry does.
    pub fn load_prompt_cache_entry(&self, path: &Path) -> Result<SavedEntryInfo> {
        self.front.load_entry(path)
    }
}

impl Submitter {
    /// As [`Engine::save_prompt_cache_entry`] (from a face's worker thread).
    pub fn save_prompt_cache_entry(&self, prompt: Option<Request>, path: &Path) -> Result<Option<SavedEntryInfo>> {
        self.front.save_entry(prompt, path)
    }

    /// As [`Engine::load_prompt_cache_entry`].
    pub fn load_prompt_cache_entry(&self, path: &Path) -> Result<SavedEntryInfo> {
        self.front.load_entry(path)
    }
}

impl Front {
    fn save_entry(&self, prompt: Option<Request>, path: &Path) -> Result<Option<SavedEntryInfo>> {
        self.health.check()?;
        self.no_lockstep()?;
        let ids = prompt.map(|r| self.prompt_ids(r)).transpose()?;
        let path = path.to_path_buf();
        self.on_driver(move |core| core.save_cache_entry(ids.as_deref(), &path))
    }

    fn load_entry(&self, path: &Path) -> Result<SavedEntryInfo> {
        self.health.check()?;
        self.no_lockstep()?;
        let path = path.to_path_buf();
        self.on_driver(move |core| core.load_cache_entry(&path))
    }

    fn no_lockstep(&self) -> Result<()> {
        if self.preparer.is_lockstep() {
            // Every rank must hold the same entries; only rank 0 would read the file.
            return Err(Error::Unsupported("prompt-cache entries are not saved or loaded on a multi-rank engine".into()));
        }
        Ok(())
    }

    /// The token ids a request with this input would prefill.
    fn prompt_ids(&self, mut request: Request) -> Result<Vec<u32>> {
        if !request.images.is_empty() || !request.audio.is_empty() {
            return Err(Error::InvalidRequest("a prompt-cache entry is chosen by a text prompt; images and audio are not".into()));
        }
        request.max_tokens = 1;
        self.preparer.prompt_ids(self.check(request)?)
    }

    /// Runs `task` on the driver thread between two steps and waits for its result.
    fn on_driver<T: Send + 'static>(&self, task: impl FnOnce(&mut EngineCore) -> Result<T> + Send + 'static) -> Result<T> {
        let (tx, rx) = mpsc::channel();
        let run: CoreTask = Box::new(move |core| {
            // A bug here fails this call, not the engine.
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task(core)))
                .unwrap_or_else(|p| Err(Error::Mlx(format!("internal error: {}", super::events::panic_message(p.as_ref())))));
            let _ = tx.send(out);
        });
        let gone = || self.health.check().err().unwrap_or(Error::Shutdown);
        self.tx.send(Command::Core(run)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}
