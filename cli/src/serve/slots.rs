//! llama-server's slot save / restore, `POST /slots/{id}?action=save|restore` with
//! `{"filename": "..."}`: one prompt-cache entry written to, or read from, a file of
//! `--prompt-cache-dir` (alias `--slot-save-path`). Weft has no per-slot caches: its one
//! prompt cache is shared by every request, and it is slot 0. A save writes the most recently
//! used entry, or with `messages` / `prompt` in the body (a Weft extension) the entry a
//! request with that prompt would reuse.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::errors::{json_response, ApiError, ErrorKind, Protocol};
use super::params::{self, get};
use super::state::AppState;

pub async fn slot(State(state): State<Arc<AppState>>, Path(id): Path<String>, req: axum::extract::Request) -> Response {
    // `?action=save`: names and values that need no percent-decoding.
    let action = req.uri().query().unwrap_or("").split('&').find_map(|kv| kv.strip_prefix("action=")).map(str::to_string);
    match slot_inner(&state, &id, action.as_deref(), req).await {
        Ok(r) => r,
        Err(e) => e.into_response(Protocol::OpenAi),
    }
}

async fn slot_inner(state: &Arc<AppState>, id: &str, action: Option<&str>, req: axum::extract::Request) -> Result<Response, ApiError> {
    state.check_open()?;
    if id != "0" {
        return Err(ApiError::new(ErrorKind::NotFound, format!("no slot {id}: Weft's one prompt cache, shared by every request, is slot 0")));
    }
    let save = match action {
        Some("save") => true,
        Some("restore") => false,
        Some(other) => return Err(ApiError::field("action", format!("unknown action {other:?}: use save or restore"))),
        None => return Err(ApiError::field("action", "`action` (save or restore) is required")),
    };
    let Some(dir) = state.engine.config().prompt_cache_dir.clone() else {
        return Err(ApiError::invalid("slot save and restore need a directory for the files: start the server with --prompt-cache-dir (or --slot-save-path)"));
    };
    let body = params::read_body(req, state.limits.body_bytes).await?;
    let filename = match get(&body, "filename") {
        Some(serde_json::Value::String(f)) => f.clone(),
        _ => return Err(ApiError::field("filename", "`filename` (a string) is required")),
    };
    let path = file_in(&dir, &filename)?;
    let dir = dir.clone();
    let prompt = if save { super::openai::cache_prompt(state, &body)? } else { None };
    let started = Instant::now();
    let out = state
        .blocking(move |state| {
            if save {
                std::fs::create_dir_all(&dir).map_err(|e| ApiError::new(ErrorKind::Internal, format!("prompt-cache directory {}: {e}", dir.display())))?;
                match state.engine.save_prompt_cache_entry(prompt, &path) {
                    Ok(Some(info)) => Ok(info),
                    Ok(None) => Err(ApiError::new(ErrorKind::NotFound, "the prompt cache holds no entry to save (for this prompt)")),
                    Err(e) => Err(engine_error(e)),
                }
            } else {
                if !path.is_file() {
                    return Err(ApiError::new(ErrorKind::NotFound, format!("no saved entry {filename:?} in the prompt-cache directory")));
                }
                state.engine.load_prompt_cache_entry(&path).map_err(engine_error)
            }
        })
        .await?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let filename = get(&body, "filename").cloned();
    let body = if save {
        json!({"id_slot": 0, "filename": filename, "n_saved": out.tokens, "n_written": out.bytes, "timings": {"save_ms": ms}})
    } else {
        json!({"id_slot": 0, "filename": filename, "n_restored": out.tokens, "n_read": out.bytes, "timings": {"restore_ms": ms}})
    };
    Ok(json_response(StatusCode::OK, &body))
}

/// A file of the prompt-cache directory: a plain name only (no directories, no `..`).
fn file_in(dir: &std::path::Path, name: &str) -> Result<PathBuf, ApiError> {
    let plain = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.chars().any(|c| matches!(c, '/' | '\\' | '\0' | ':') || c.is_control());
    if !plain {
        return Err(ApiError::field("filename", format!("`filename` must be a plain file name (no directories, no leading dot): {name:?}")));
    }
    Ok(dir.join(name))
}

/// A cache that is off, or a file the engine refuses (another model's, damaged, too large),
/// is the caller's to fix: 400.
fn engine_error(e: weft::Error) -> ApiError {
    match e {
        weft::Error::Unsupported(m) => ApiError::invalid(m),
        other => ApiError::from_engine(other),
    }
}
