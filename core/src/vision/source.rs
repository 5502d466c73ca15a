//! Where request images and audio clips come from, for every face: `data:` URLs and bare base64 (bytes in the
//! request), local file paths (`file://` or plain), never the network: an `http(s)://` URL is
//! refused with a message that says what to send instead.

use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::{Error, Result};

/// Whether a request may name local files as media (`file://` URLs and plain paths): a face's
/// policy, passed as a value ([`crate::engine::EngineConfig::local_media`], the engine option
/// `local_media`). The library faces default to [`LocalMedia::Any`] (the embedding app decides
/// what its requests name); `weft serve` to [`LocalMedia::Deny`] unless given
/// `--allowed-media-dir`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LocalMedia {
    /// Local paths are refused.
    Deny,
    /// Any regular file the process can read.
    #[default]
    Any,
    /// Only regular files whose canonical path (symlinks resolved) lies inside one of these
    /// canonical directories. Every refusal reads the same, whether the file is missing, a
    /// directory, unreadable or outside: the message reveals nothing about the file system.
    Dirs(Vec<PathBuf>),
}

impl LocalMedia {
    /// [`LocalMedia::Dirs`] from directories that must exist (they are canonicalized now).
    pub fn dirs<P: AsRef<Path>>(dirs: &[P]) -> Result<Self> {
        let mut out = Vec::new();
        for d in dirs {
            let d = d.as_ref();
            let canonical = std::fs::canonicalize(d).map_err(|e| Error::io(d, e))?;
            if !canonical.is_dir() {
                return Err(Error::InvalidRequest(format!("allowed media dir {}: not a directory", d.display())));
            }
            out.push(canonical);
        }
        Ok(LocalMedia::Dirs(out))
    }

    /// From the engine option's JSON: `"any"`, `"deny"` or `{"dirs": [paths]}`.
    pub fn from_json(v: &serde_json::Value, name: &str) -> Result<Self> {
        use serde_json::Value;
        let bad = || Error::InvalidRequest(format!("{name} must be \"any\", \"deny\" or {{\"dirs\": [directory paths]}}"));
        match v {
            Value::String(s) if s == "any" => Ok(LocalMedia::Any),
            Value::String(s) if s == "deny" => Ok(LocalMedia::Deny),
            Value::Object(m) if m.len() == 1 => {
                let dirs = m.get("dirs").and_then(Value::as_array).ok_or_else(bad)?;
                let dirs: Vec<&str> = dirs.iter().map(|d| d.as_str().filter(|s| !s.is_empty())).collect::<Option<_>>().ok_or_else(bad)?;
                Self::dirs(&dirs)
            }
            _ => Err(bad()),
        }
    }
}

use crate::limits::MAX_IMAGE_BYTES;

/// What a source holds, for messages and examples.
#[derive(Clone, Copy)]
enum Kind {
    Image,
    Audio,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Image => "image",
            Kind::Audio => "audio",
        }
    }

    fn example(self) -> &'static str {
        match self {
            Kind::Image => "data:image/png;base64,...",
            Kind::Audio => "data:audio/wav;base64,...",
        }
    }
}

fn too_big(kind: Kind, n: usize) -> Error {
    Error::InvalidRequest(format!("{} of {n} bytes, more than the {MAX_IMAGE_BYTES}-byte limit", kind.name()))
}

/// Decodes standard base64 (whitespace ignored).
pub fn base64_bytes(text: &str) -> Result<Vec<u8>> {
    base64_of(Kind::Image, text)
}

/// [`base64_bytes`] for an audio clip (its errors say "audio").
pub fn audio_base64(text: &str) -> Result<Vec<u8>> {
    base64_of(Kind::Audio, text)
}

fn base64_of(kind: Kind, text: &str) -> Result<Vec<u8>> {
    let clean: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    if clean.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
        return Err(too_big(kind, clean.len() / 4 * 3));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(clean.as_bytes())
        .map_err(|e| Error::InvalidRequest(format!("{}: invalid base64 ({e})", kind.name())))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(too_big(kind, bytes.len()));
    }
    Ok(bytes)
}

/// The bytes of an image given as a `data:` URL, a `file://` URL or a local path (any local
/// path: [`LocalMedia::Any`]).
pub fn image_from_url(url: &str) -> Result<Vec<u8>> {
    from_url(Kind::Image, url, &LocalMedia::Any)
}

/// The bytes of an audio clip given as a `data:` URL, a `file://` URL or a local path (any
/// local path: [`LocalMedia::Any`]).
pub fn audio_from_url(url: &str) -> Result<Vec<u8>> {
    from_url(Kind::Audio, url, &LocalMedia::Any)
}

/// [`image_from_url`], local paths read as `local` allows.
pub fn image_from_url_with(url: &str, local: &LocalMedia) -> Result<Vec<u8>> {
    from_url(Kind::Image, url, local)
}

/// [`audio_from_url`], local paths read as `local` allows.
pub fn audio_from_url_with(url: &str, local: &LocalMedia) -> Result<Vec<u8>> {
    from_url(Kind::Audio, url, local)
}

fn from_url(kind: Kind, url: &str, local: &LocalMedia) -> Result<Vec<u8>> {
    let what = kind.name();
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Err(Error::InvalidRequest(format!(
            "{what}: remote URLs are not fetched (weft never reaches the network for a request); \
             send the {what} as a data: URL (base64) or a local file path"
        )));
    }
    if let Some(rest) = url.strip_prefix("data:") {
        let (meta, data) = rest
            .split_once(',')
            .ok_or_else(|| Error::InvalidRequest(format!("{what}: a data: URL needs a comma before its data")))?;
        if !meta.ends_with(";base64") {
            return Err(Error::InvalidRequest(format!("{what}: a data: URL must be base64 ({})", kind.example())));
        }
        return base64_of(kind, data);
    }
    let path = url.strip_prefix("file://").unwrap_or(url);
    if path.is_empty() || path.contains("://") {
        return Err(Error::InvalidRequest(format!("{what}: {url:?} is neither a data: URL nor a local file path")));
    }
    match local {
        LocalMedia::Any => {}
        LocalMedia::Deny => {
            return Err(Error::InvalidRequest(format!(
                "{what}: local media paths are not allowed; send the {what} as a data: URL (base64)"
            )))
        }
        LocalMedia::Dirs(dirs) => return read_inside(kind, path, dirs),
    }
    let cannot = |e: std::io::Error| Error::InvalidRequest(format!("{what}: cannot read {path:?}: {e}"));
    let meta = std::fs::metadata(path).map_err(cannot)?;
    // Regular files only: a device or FIFO could block or never end.
    if !meta.is_file() {
        return Err(Error::InvalidRequest(format!("{what}: {path:?} is not a regular file")));
    }
    if meta.len() > MAX_IMAGE_BYTES as u64 {
        return Err(too_big(kind, meta.len() as usize));
    }
    let mut bytes = Vec::new();
    use std::io::Read as _;
    std::fs::File::open(path).map_err(cannot)?.take(MAX_IMAGE_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(too_big(kind, bytes.len()));
    }
    Ok(bytes)
}

/// A local file under [`LocalMedia::Dirs`]: one message for every refusal, so that a client
/// learns nothing about files outside (existence, type, size, permissions).
fn read_inside(kind: Kind, path: &str, dirs: &[PathBuf]) -> Result<Vec<u8>> {
    let what = kind.name();
    // The path is not echoed either: every refusal's body is the same.
    let refused = || Error::InvalidRequest(format!("{what}: the local path is not a readable file inside an allowed media dir"));
    let canonical = std::fs::canonicalize(path).map_err(|_| refused())?;
    if !dirs.iter().any(|d| canonical.starts_with(d)) {
        return Err(refused());
    }
    use std::io::Read as _;
    let file = std::fs::File::open(&canonical).map_err(|_| refused())?;
    // Regular files only (checked on the opened file): a device or FIFO could block or never end.
    let meta = file.metadata().map_err(|_| refused())?;
    if !meta.is_file() {
        return Err(refused());
    }
    if meta.len() > MAX_IMAGE_BYTES as u64 {
        return Err(too_big(kind, meta.len() as usize));
    }
    let mut bytes = Vec::new();
    file.take(MAX_IMAGE_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|_| refused())?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(too_big(kind, bytes.len()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_decode_or_refuse_clearly() {
        assert_eq!(image_from_url("data:image/png;base64,iVBO Rw==").unwrap(), vec![0x89, 0x50, 0x4e, 0x47]);
        for (url, needle) in [
            ("https://example.com/cat.png", "remote URLs are not fetched"),
            ("HTTP://example.com/cat.png", "remote URLs are not fetched"),
            ("data:image/png,abc", "must be base64"),
            ("data:image/png;base64", "needs a comma"),
            ("data:image/png;base64,@@@", "invalid base64"),
            ("ftp://host/x.png", "neither a data: URL nor a local file path"),
            ("/nonexistent/x.png", "cannot read"),
            ("/", "not a regular file"),
            ("/dev/zero", "not a regular file"),
        ] {
            let e = image_from_url(url).unwrap_err().to_string();
            assert!(e.contains(needle), "{url}: {e}");
        }
        let e = audio_from_url("https://example.com/a.wav").unwrap_err().to_string();
        assert!(e.contains("audio: remote URLs are not fetched") && e.contains("send the audio"), "{e}");
        assert!(audio_base64("@@").unwrap_err().to_string().contains("audio: invalid base64"));
    }

    #[test]
    fn local_paths_follow_the_policy() {
        let root = std::env::temp_dir().join(format!("weft-local-media-{}", std::process::id()));
        let allowed = root.join("allowed");
        std::fs::create_dir_all(allowed.join("sub")).unwrap();
        std::fs::write(allowed.join("a.png"), b"png!").unwrap();
        std::fs::write(root.join("secret.txt"), b"secret").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(root.join("secret.txt"), allowed.join("escape.png")).unwrap();
        let policy = LocalMedia::dirs(&[&allowed]).unwrap();
        let inside = allowed.join("a.png");
        assert_eq!(image_from_url_with(inside.to_str().unwrap(), &policy).unwrap(), b"png!");
        assert_eq!(image_from_url_with(&format!("file://{}", inside.display()), &policy).unwrap(), b"png!");
        // Missing, a directory, outside, `..` out, a symlink out, /proc, /etc/shadow: one message.
        let outside = root.join("secret.txt");
        let dotdot = format!("{}/../secret.txt", allowed.display());
        for p in [
            allowed.join("missing.png").to_str().unwrap(),
            allowed.join("sub").to_str().unwrap(),
            outside.to_str().unwrap(),
            dotdot.as_str(),
            #[cfg(unix)]
            allowed.join("escape.png").to_str().unwrap(),
            "/proc/self/environ",
            "/etc/shadow",
            "/dev/zero",
        ] {
            let e = image_from_url_with(p, &policy).unwrap_err().to_string();
            assert_eq!(e, "invalid request: image: the local path is not a readable file inside an allowed media dir", "{p}");
        }
        let e = audio_from_url_with(inside.to_str().unwrap(), &LocalMedia::Deny).unwrap_err().to_string();
        assert!(e.contains("audio: local media paths are not allowed"), "{e}");
        assert_eq!(image_from_url_with("data:image/png;base64,iVBO Rw==", &LocalMedia::Deny).unwrap().len(), 4);
        assert_eq!(image_from_url(inside.to_str().unwrap()).unwrap(), b"png!", "the default reads any path");
        assert_eq!(LocalMedia::from_json(&serde_json::json!("deny"), "local_media").unwrap(), LocalMedia::Deny);
        assert_eq!(LocalMedia::from_json(&serde_json::json!({"dirs": [allowed]}), "local_media").unwrap(), policy);
        assert!(LocalMedia::from_json(&serde_json::json!({"dirs": [root.join("nope")]}), "x").is_err());
        assert!(LocalMedia::from_json(&serde_json::json!("all"), "x").is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
