//! The Hub's HTTP API, as `huggingface_hub` uses it: the revision's commit and file list
//! (`GET /api/models/{repo}/revision/{rev}`), one file's etag and size
//! (`HEAD /{repo}/resolve/{commit}/{file}`, redirects not followed: an LFS file's 302 carries
//! `X-Linked-Etag` and `X-Linked-Size`), and the Hub's error headers (`X-Error-Code`).

use super::{HubOptions, RepoRef};
use crate::error::{Error, Result};

/// The commit a revision names and the paths of its files.
pub(super) struct RevisionInfo {
    pub sha: String,
    pub files: Vec<String>,
}

/// What the Hub says about one file of a commit.
pub(super) struct FileMeta {
    /// The blob's name in the cache: the sha256 of an LFS file, the git object id of another.
    pub etag: String,
    pub size: u64,
    /// Where to GET it (the Hub redirects LFS files to its CDN).
    pub url: String,
}

impl FileMeta {
    pub fn is_sha256(&self) -> bool {
        self.etag.len() == 64 && self.etag.bytes().all(|b| b.is_ascii_hexdigit())
    }
}

pub(super) enum ApiError {
    /// No answer from the Hub (connection, DNS, TLS, timeout, 5xx): the cache may stand in.
    Unreachable(String),
    /// The Hub answered no (unknown repo, revision or file, no access).
    Fatal(Error),
}

impl ApiError {
    pub fn into_error(self) -> Error {
        match self {
            ApiError::Unreachable(msg) => Error::Download(format!("the Hugging Face Hub did not answer: {msg}")),
            ApiError::Fatal(e) => e,
        }
    }
}

/// Percent-encodes a URL path segment (RFC 3986 unreserved characters stay).
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A repo file's path, each segment encoded.
fn encode_path(path: &str) -> String {
    path.split('/').map(encode).collect::<Vec<_>>().join("/")
}

pub(super) fn resolve_url(opts: &HubOptions, repo: &str, commit: &str, file: &str) -> String {
    format!("{}/{repo}/resolve/{}/{}", opts.endpoint, encode(commit), encode_path(file))
}

fn authorized<B>(mut req: ureq::RequestBuilder<B>, opts: &HubOptions) -> ureq::RequestBuilder<B> {
    if let Some(token) = &opts.token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    req
}

fn header(resp: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// The error of a refusing answer, from the Hub's `X-Error-Code` (as `huggingface_hub` reads
/// it) or else the status. `file`: the request was for that file.
fn refusal(opts: &HubOptions, r: &RepoRef, status: u16, resp: &ureq::http::Response<ureq::Body>, file: Option<&str>) -> ApiError {
    if status >= 500 || status == 429 || status == 408 {
        return ApiError::Unreachable(format!("HTTP {status}"));
    }
    let code = header(resp, "x-error-code").unwrap_or_default();
    let hub_msg = header(resp, "x-error-message").map(|m| format!(" (the Hub says: {m})")).unwrap_or_default();
    let token_hint = if opts.token.is_some() {
        "the HF_TOKEN given has no access to it"
    } else {
        "if it is private or gated, set HF_TOKEN to an access token (https://huggingface.co/settings/tokens)"
    };
    let message = match (code.as_str(), status) {
        ("GatedRepo", _) | ("", 403) => format!(
            "access to {} is restricted (a gated or private repo){hub_msg}: accept its terms at {}/{} and \
             {}",
            r.repo,
            opts.endpoint,
            r.repo,
            if opts.token.is_some() { "check that the HF_TOKEN given belongs to that account" } else { "set HF_TOKEN to an access token of that account" }
        ),
        ("RevisionNotFound", _) => format!("revision {:?} not found in {} on {}{hub_msg}", r.revision(), r.repo, opts.endpoint),
        ("EntryNotFound", _) => {
            format!("{} not found in {}@{} on {}{hub_msg}", file.unwrap_or("the file"), r.repo, r.revision(), opts.endpoint)
        }
        ("RepoNotFound", _) | ("", 401 | 404) if file.is_none() || code == "RepoNotFound" => format!(
            "{r} is not a local path, and there is no repository {} on {}{hub_msg}; {token_hint}",
            r.repo, opts.endpoint
        ),
        _ => format!(
            "{} of {r}: HTTP {status} from {}{hub_msg}",
            file.unwrap_or("the revision info"),
            opts.endpoint
        ),
    };
    ApiError::Fatal(Error::Download(message))
}

pub(super) fn revision_info(agent: &ureq::Agent, opts: &HubOptions, r: &RepoRef) -> Result<RevisionInfo, ApiError> {
    let url = format!("{}/api/models/{}/revision/{}", opts.endpoint, r.repo, encode(r.revision()));
    let resp = authorized(agent.get(&url), opts).call().map_err(|e| ApiError::Unreachable(e.to_string()))?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(refusal(opts, r, status, &resp, None));
    }
    let bad = |m: String| ApiError::Fatal(Error::Download(format!("GET {url}: {m}")));
    let body = resp.into_body().read_to_string().map_err(|e| ApiError::Unreachable(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&body).map_err(|e| bad(format!("not JSON: {e}")))?;
    let sha = json["sha"].as_str().ok_or_else(|| bad("no \"sha\"".into()))?.to_string();
    if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad(format!("\"sha\" {sha:?} is not a commit id")));
    }
    let files = json["siblings"]
        .as_array()
        .ok_or_else(|| bad("no \"siblings\" list".into()))?
        .iter()
        .filter_map(|s| s["rfilename"].as_str().map(str::to_string))
        .collect();
    Ok(RevisionInfo { sha, files })
}

/// `"abc"`, `W/"abc"` → `abc`.
fn bare_etag(v: &str) -> String {
    v.trim().trim_start_matches("W/").trim_matches('"').to_string()
}

pub(super) fn file_meta(
    agent: &ureq::Agent,
    opts: &HubOptions,
    r: &RepoRef,
    commit: &str,
    file: &str,
) -> Result<FileMeta, ApiError> {
    let url = resolve_url(opts, &r.repo, commit, file);
    let mut at = url.clone();
    // Relative redirects (a renamed repo) are followed; the one to the CDN is where the
    // LFS headers are, so it is not.
    for _ in 0..5 {
        let req = authorized(agent.head(&at), opts).header("Accept-Encoding", "identity");
        let resp = req.config().max_redirects(0).build().call().map_err(|e| ApiError::Unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        let linked = header(&resp, "x-linked-etag");
        let location = header(&resp, "location");
        if (300..400).contains(&status) && linked.is_none() {
            if let Some(loc) = location.filter(|l| l.starts_with('/')) {
                at = format!("{}{loc}", opts.endpoint);
                continue;
            }
        }
        if !(200..400).contains(&status) {
            return Err(refusal(opts, r, status, &resp, Some(file)));
        }
        let etag = linked.or_else(|| header(&resp, "etag")).map(|e| bare_etag(&e)).filter(|e| !e.is_empty());
        let size = header(&resp, "x-linked-size")
            .or_else(|| header(&resp, "content-length"))
            .and_then(|s| s.trim().parse::<u64>().ok());
        let (Some(etag), Some(size)) = (etag, size) else {
            return Err(ApiError::Fatal(Error::Download(format!(
                "HEAD {at}: the answer names no ETag or size for {file}; is {} a Hugging Face Hub?",
                opts.endpoint
            ))));
        };
        if etag.contains(['/', '\\']) || etag.starts_with('.') {
            return Err(ApiError::Fatal(Error::Download(format!("HEAD {at}: unusable ETag {etag:?}"))));
        }
        return Ok(FileMeta { etag, size, url });
    }
    Err(ApiError::Fatal(Error::Download(format!("HEAD {url}: too many redirects"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_encoded_and_etags_bare() {
        let o = HubOptions::new("/c");
        assert_eq!(
            resolve_url(&o, "o/r", "refs/pr/1", "sub dir/a+b.json"),
            "https://huggingface.co/o/r/resolve/refs%2Fpr%2F1/sub%20dir/a%2Bb.json"
        );
        assert_eq!(bare_etag("W/\"abc\""), "abc");
        assert_eq!(bare_etag("\"0123\""), "0123");
    }
}
