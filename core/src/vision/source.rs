//! Where request images and audio clips come from, for every face: `data:` URLs and bare base64 (bytes in the
//! request), local file paths (`file://` or plain), never the network: an `http(s)://` URL is
//! refused with a message that says what to send instead.

use base64::Engine as _;

use crate::{Error, Result};

/// Largest encoded image a request may carry (bytes).
pub const MAX_IMAGE_BYTES: usize = 20 << 20;
/// Most images one request may carry at the contract level (a model may allow fewer).
pub const MAX_IMAGES: usize = 16;

/// Most audio clips one request may carry at the contract level (a model may allow fewer).
pub const MAX_CLIPS: usize = 8;

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

/// The bytes of an image given as a `data:` URL, a `file://` URL or a local path.
pub fn image_from_url(url: &str) -> Result<Vec<u8>> {
    from_url(Kind::Image, url)
}

/// The bytes of an audio clip given as a `data:` URL, a `file://` URL or a local path.
pub fn audio_from_url(url: &str) -> Result<Vec<u8>> {
    from_url(Kind::Audio, url)
}

fn from_url(kind: Kind, url: &str) -> Result<Vec<u8>> {
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
}
