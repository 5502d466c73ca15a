//! Who may talk to the sidecar: browser origins (CORS), the `Host` header (DNS rebinding) and
//! the API key.
//!
//! The threat model (docs/server.md, "Security"): the server runs on the user's machine inside
//! an app. Web pages the user visits can send requests to `127.0.0.1` through the browser, and
//! a DNS-rebinding page can make its own host name resolve to it. Browsers always send `Origin`
//! on cross-origin requests (and on every POST) and always send the page's host as `Host`, so
//! refusing foreign origins and foreign hosts shuts both out; non-browser clients (the official
//! SDKs, curl) send no `Origin` and a loopback `Host`, and are unaffected.

use axum::http::{header, HeaderMap, HeaderValue};

/// Browser origins allowed to call the server (`--allowed-origins`, `$WEFT_ALLOWED_ORIGINS`).
#[derive(Debug, Clone)]
pub struct OriginPolicy {
    any: bool,
    local: bool,
    exact: Vec<String>,
}

/// The entry in `--allowed-origins` that stands for the defaults.
pub const LOCAL_ORIGINS: &str = "local";

impl OriginPolicy {
    /// From the flag's entries: `*` (any origin), `local` (the defaults: loopback pages and app
    /// schemes), or exact origins such as `https://app.example.com` or `null`. No entries means
    /// the defaults.
    pub fn new(entries: &[String]) -> Self {
        let entries: Vec<String> =
            entries.iter().map(|e| e.trim().trim_end_matches('/').to_string()).filter(|e| !e.is_empty()).collect();
        if entries.is_empty() {
            return OriginPolicy { any: false, local: true, exact: Vec::new() };
        }
        OriginPolicy {
            any: entries.iter().any(|e| e == "*"),
            local: entries.iter().any(|e| e.eq_ignore_ascii_case(LOCAL_ORIGINS)),
            exact: entries.into_iter().filter(|e| e != "*" && !e.eq_ignore_ascii_case(LOCAL_ORIGINS)).collect(),
        }
    }

    pub fn allows_any(&self) -> bool {
        self.any
    }

    pub fn allows(&self, origin: &str) -> bool {
        self.any || (self.local && is_local_origin(origin)) || self.exact.iter().any(|e| e.eq_ignore_ascii_case(origin))
    }

    /// For the startup line and docs: what the policy lets through.
    pub fn describe(&self) -> String {
        if self.any {
            return "any origin".into();
        }
        let mut parts = Vec::new();
        if self.local {
            parts.push("loopback and app origins".to_string());
        }
        parts.extend(self.exact.iter().cloned());
        if parts.is_empty() {
            "no browser origins".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Pages served from this machine (`http(s)://localhost|127.0.0.1|[::1]` on any port) and the
/// schemes app shells load their UI from: `tauri://`, `app://` (Electron's custom protocol),
/// `http(s)://tauri.localhost` (Tauri on Windows), `file://` (Electron's file pages). `null` is
/// not among them: any web page can send `Origin: null` from a sandboxed iframe.
fn is_local_origin(origin: &str) -> bool {
    let lower = origin.to_ascii_lowercase();
    if lower == "file://" {
        return true;
    }
    let Some((scheme, rest)) = lower.split_once("://") else { return false };
    match scheme {
        "tauri" | "app" => !rest.is_empty() && !rest.contains('/'),
        "http" | "https" => {
            let host = host_without_port(rest);
            host_is_loopback_name(host) || host == "tauri.localhost"
        }
        _ => false,
    }
}

/// `example.com:8080` → `example.com`, `[::1]:80` → `[::1]`.
fn host_without_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) if is_port_suffix(&authority[end + 1..]) => &authority[..=end],
            _ => authority,
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// `""` or `:digits`.
fn is_port_suffix(s: &str) -> bool {
    s.is_empty() || s.strip_prefix(':').is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

fn host_is_loopback_name(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

/// `Host` headers accepted (`--allowed-hosts`, `$WEFT_ALLOWED_HOSTS`). Enforced when the server
/// is bound to a loopback address (or when hosts were given): a DNS-rebinding page reaches
/// 127.0.0.1 under its own name, and its requests carry that name.
#[derive(Debug, Clone)]
pub struct HostPolicy {
    enforced: bool,
    names: Vec<String>,
}

impl HostPolicy {
    /// `bound`: the `--host` value. `extra`: the flag's entries (`*` turns the check off).
    pub fn new(bound: &str, extra: &[String]) -> Self {
        let extra: Vec<String> =
            extra.iter().map(|e| e.trim().to_ascii_lowercase()).filter(|e| !e.is_empty()).collect();
        if extra.iter().any(|e| e == "*") {
            return HostPolicy { enforced: false, names: Vec::new() };
        }
        let bound = bound.trim().to_ascii_lowercase();
        let bound_name = if bound.contains(':') && !bound.starts_with('[') { format!("[{bound}]") } else { bound };
        let loopback = host_is_loopback_name(&bound_name)
            || bound_name.parse::<std::net::Ipv4Addr>().is_ok_and(|a| a.is_loopback())
            || bound_name.trim_matches(|c| c == '[' || c == ']').parse::<std::net::Ipv6Addr>().is_ok_and(|a| a.is_loopback());
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "[::1]"].iter().map(|s| s.to_string()).collect();
        names.push(bound_name);
        names.extend(extra.iter().map(|e| host_without_port(e).to_string()));
        HostPolicy { enforced: loopback || !extra.is_empty(), names }
    }

    pub fn is_enforced(&self) -> bool {
        self.enforced
    }

    /// A request without `Host` (HTTP/1.0) is not from a browser and passes.
    pub fn allows(&self, host: Option<&str>) -> bool {
        if !self.enforced {
            return true;
        }
        let Some(host) = host else { return true };
        let lower = host.trim().to_ascii_lowercase();
        let name = host_without_port(&lower).trim_end_matches('.');
        self.names.iter().any(|n| n == name)
    }
}

/// The key a request presents: `Authorization: Bearer KEY` (OpenAI) or `x-api-key: KEY`
/// (Anthropic).
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case("bearer ") {
            return Some(v[7..].trim());
        }
    }
    headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim)
}

/// Compares keys in time that depends only on the expected key's length: no early exit on the
/// first differing byte, and a wrong length is folded into the same accumulator.
pub fn same_key(given: &str, expected: &str) -> bool {
    let (g, e) = (given.as_bytes(), expected.as_bytes());
    let mut diff = (g.len() != e.len()) as u8;
    for (i, &b) in e.iter().enumerate() {
        diff |= b ^ g.get(i).copied().unwrap_or(0);
    }
    std::hint::black_box(diff) == 0
}

/// CORS response headers for an allowed origin (none when the request had no `Origin`).
pub fn cors_headers(policy: &OriginPolicy, origin: Option<&HeaderValue>, request_headers: Option<&HeaderValue>, out: &mut HeaderMap) {
    let Some(origin) = origin else { return };
    let value = if policy.allows_any() { HeaderValue::from_static("*") } else { origin.clone() };
    out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    out.insert(header::VARY, HeaderValue::from_static("Origin"));
    out.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE, OPTIONS"));
    // `*` does not cover `Authorization`, so the requested headers are echoed when given.
    let allow_headers = request_headers.cloned().unwrap_or_else(|| HeaderValue::from_static("*"));
    out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allow_headers);
    out.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(entries: &[&str]) -> OriginPolicy {
        OriginPolicy::new(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn default_origins_are_local_pages_and_app_schemes() {
        let p = policy(&[]);
        for ok in [
            "http://localhost",
            "http://localhost:5173",
            "http://127.0.0.1:8080",
            "http://[::1]:3000",
            "https://localhost",
            "tauri://localhost",
            "http://tauri.localhost",
            "app://my-app",
            "file://",
        ] {
            assert!(p.allows(ok), "{ok}");
        }
        for bad in [
            "https://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:8080",
            "http://evil.example:8080",
            "null",
            "http://[::1].evil",
            "ftp://localhost",
            "app://x/../y",
            "",
        ] {
            assert!(!p.allows(bad), "{bad}");
        }
    }

    #[test]
    fn origins_flag_replaces_or_extends_the_defaults() {
        let p = policy(&["https://app.example.com"]);
        assert!(p.allows("https://app.example.com") && !p.allows("http://localhost:3000"));
        let p = policy(&["local", "https://app.example.com/", "null"]);
        assert!(p.allows("https://app.example.com") && p.allows("http://localhost:3000") && p.allows("null"));
        let p = policy(&["*"]);
        assert!(p.allows("https://evil.example") && p.allows_any());
    }

    #[test]
    fn hosts_are_checked_on_loopback_only() {
        let p = HostPolicy::new("127.0.0.1", &[]);
        assert!(p.is_enforced());
        for ok in ["127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:8080", "localhost.:80"] {
            assert!(p.allows(Some(ok)), "{ok}");
        }
        for bad in ["evil.example:8080", "evil.example", "127.0.0.1.nip.io:8080", "[::2]:80"] {
            assert!(!p.allows(Some(bad)), "{bad}");
        }
        assert!(p.allows(None));
        let p = HostPolicy::new("127.0.0.1", &["mybox.local".into()]);
        assert!(p.allows(Some("mybox.local:8080")) && !p.allows(Some("evil.example")));
        assert!(!HostPolicy::new("0.0.0.0", &[]).is_enforced());
        assert!(HostPolicy::new("::1", &[]).allows(Some("[::1]:9")));
        assert!(!HostPolicy::new("127.0.0.1", &["*".into()]).is_enforced());
    }

    #[test]
    fn keys_compare_exactly() {
        assert!(same_key("abc", "abc"));
        assert!(!same_key("abd", "abc"));
        assert!(!same_key("ab", "abc"));
        assert!(!same_key("abcd", "abc"));
        assert!(!same_key("", "abc"));
    }
}
