//! Secrets kept on the host (`WASMBOX_SECRETS`): the guest sees a placeholder in its
//! environment; the host puts the value into requests to that secret's hosts only, and puts the
//! placeholder back wherever the value appears in what a host call answers. The answer is the
//! only way anything of the host's reaches a guest, so the value cannot reach its output, its
//! files, its jobs or its saved state.
//!
//! A value the host put into a URL travels on percent-encoded, and a host may echo it back in a
//! redirect's `Location`: scrubbing knows every form the host's own encoders give the value, and
//! [`carried`] decodes a URL to find the value in forms it does not, so that no hop to a host
//! outside the secret's list carries it.

use super::policy::{BadPattern, HostList, HostPattern};

/// The setting, for errors that name it.
pub const SECRETS: &str = "WASMBOX_SECRETS";

#[derive(Clone)]
pub struct Secret {
    /// The variable's name, in the host's environment and the guest's.
    pub name: String,
    value: Vec<u8>,
    /// The value as it stands raw and as the host's encoders write it (URL path, query,
    /// fragment, user info, form and full percent-encoding), longest first: what scrubbing
    /// replaces.
    forms: Vec<Vec<u8>>,
    pub placeholder: String,
    /// Where the value may be sent.
    pub hosts: HostList,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// An entry of `WASMBOX_SECRETS` that does not hold, and why.
#[derive(Clone, Debug, thiserror::Error)]
pub enum BadSecret {
    #[error("{SECRETS}: {0:?} names no hosts (NAME@host, e.g. GITHUB_TOKEN@api.github.com)")]
    NoHosts(String),
    #[error("{SECRETS}: {0:?} is not a variable name")]
    BadName(String),
    #[error("{SECRETS}: {0}")]
    Host(BadPattern),
    #[error("{SECRETS}: {0} is not set in the server's environment")]
    Unset(String),
}

/// Reads `WASMBOX_SECRETS`: comma-separated `NAME@host[|host...]`, each `NAME` a variable of
/// the server's environment.
pub fn from_env() -> Result<Vec<Secret>, BadSecret> {
    let Ok(spec) = std::env::var(SECRETS) else {
        return Ok(Vec::new());
    };
    parse(&spec, |name| std::env::var(name).ok())
}

pub(crate) fn parse(
    spec: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Vec<Secret>, BadSecret> {
    let tag: [u8; 8] = rand_bytes();
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            let (name, hosts) = entry
                .split_once('@')
                .ok_or_else(|| BadSecret::NoHosts(entry.to_string()))?;
            let name = name.trim();
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(BadSecret::BadName(name.to_string()));
            }
            let hosts = hosts
                .split('|')
                .map(HostPattern::parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(BadSecret::Host)?;
            let value = lookup(name)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| BadSecret::Unset(name.to_string()))?;
            Ok(Secret {
                name: name.to_string(),
                forms: forms(&value),
                value: value.into_bytes(),
                placeholder: format!("WASMBOX_SECRET_{name}_{tag}"),
                hosts: HostList::from_patterns(hosts),
            })
        })
        .collect()
}

/// `value` raw and in each encoding the host's URL handling may give it.
fn forms(value: &str) -> Vec<Vec<u8>> {
    use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
    let mut out = vec![value.to_string()];
    if let Ok(mut u) = url::Url::parse("http://h/") {
        u.set_path(&format!("/{value}"));
        out.push(u.path()[1..].to_string());
        u.set_query(Some(value));
        out.extend(u.query().map(str::to_string));
        u.set_fragment(Some(value));
        out.extend(u.fragment().map(str::to_string));
        if u.set_username(value).is_ok() {
            out.push(u.username().to_string());
        }
    }
    out.push(url::form_urlencoded::byte_serialize(value.as_bytes()).collect());
    let full = utf8_percent_encode(value, NON_ALPHANUMERIC).to_string();
    out.push(lower_hex(&full));
    out.push(full);
    let mut out: Vec<Vec<u8>> = out.into_iter().map(String::into_bytes).collect();
    out.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
    out.dedup();
    out
}

/// `s` with lower-case hex digits in its `%XX` escapes, as some servers write them.
fn lower_hex(s: &str) -> String {
    let mut left = 0;
    s.chars()
        .map(|c| {
            if c == '%' {
                left = 2;
                c
            } else if left > 0 {
                left -= 1;
                c.to_ascii_lowercase()
            } else {
                c
            }
        })
        .collect()
}

fn rand_bytes() -> [u8; 8] {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("host entropy");
    b
}

/// `hay` with every `from` replaced by `to`; `None` when there is none.
fn replaced(hay: &[u8], from: &[u8], to: &[u8]) -> Option<Vec<u8>> {
    if from.is_empty() || hay.len() < from.len() {
        return None;
    }
    let mut out: Option<Vec<u8>> = None;
    let mut last = 0;
    let mut i = 0;
    while i + from.len() <= hay.len() {
        if &hay[i..i + from.len()] == from {
            let o = out.get_or_insert_with(|| Vec::with_capacity(hay.len()));
            o.extend_from_slice(&hay[last..i]);
            o.extend_from_slice(to);
            i += from.len();
            last = i;
        } else {
            i += 1;
        }
    }
    let mut o = out?;
    o.extend_from_slice(&hay[last..]);
    Some(o)
}

/// What a request to `host:port` carries: the placeholders of the secrets that may go there
/// replaced by their values.
pub fn insert(secrets: &[Secret], host: &str, port: u16, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut cur: Option<Vec<u8>> = None;
    for s in secrets.iter().filter(|s| s.hosts.matches(host, port)) {
        let hay = cur.as_deref().unwrap_or(bytes);
        if let Some(next) = replaced(hay, s.placeholder.as_bytes(), &s.value) {
            cur = Some(next);
        }
    }
    cur
}

/// `bytes` with every secret's value, in each of its forms, replaced by its placeholder.
pub fn scrub(secrets: &[Secret], bytes: Vec<u8>) -> Vec<u8> {
    secrets.iter().fold(bytes, |b, s| {
        s.forms.iter().fold(b, |b, form| {
            replaced(&b, form, s.placeholder.as_bytes()).unwrap_or(b)
        })
    })
}

/// The host (lower case, an IPv6 address without brackets) and port a secret's hosts are
/// matched against for a request to `url`.
pub fn host_port(url: &url::Url) -> (String, u16) {
    (
        url.host_str()
            .unwrap_or("")
            .trim_matches(['[', ']'])
            .to_ascii_lowercase(),
        url.port_or_known_default().unwrap_or(0),
    )
}

/// The first secret whose value `url` carries, in any form up to three rounds of
/// percent-decoding (and `+` as a space), to a host outside that secret's list.
pub fn carried<'a>(secrets: &'a [Secret], url: &url::Url) -> Option<&'a Secret> {
    url.host_str()?;
    let (host, port) = host_port(url);
    let outside: Vec<&Secret> = secrets
        .iter()
        .filter(|s| !s.hosts.matches(&host, port))
        .collect();
    if outside.is_empty() {
        return None;
    }
    let mut texts = vec![url.as_str().as_bytes().to_vec()];
    for _ in 0..3 {
        let last = texts.last().expect("one text at least");
        let next: Vec<u8> = percent_encoding::percent_decode(last).collect();
        if &next == last {
            break;
        }
        texts.push(next);
    }
    let spaced: Vec<Vec<u8>> = texts
        .iter()
        .map(|t| {
            t.iter()
                .map(|&b| if b == b'+' { b' ' } else { b })
                .collect()
        })
        .collect();
    texts.extend(spaced);
    outside
        .into_iter()
        .find(|s| texts.iter().any(|t| replaced(t, &s.value, b"").is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_only_to_their_hosts_and_never_come_back() {
        let s = parse(
            "TOKEN@api.example.com|*.example.org, OTHER@x.com:8443",
            |n| Some(format!("value-of-{n}")),
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        let p = s[0].placeholder.clone();
        assert!(p.starts_with("WASMBOX_SECRET_TOKEN_"));
        let req = format!("Bearer {p} and {p}");
        let out = insert(&s, "api.example.com", 443, req.as_bytes()).unwrap();
        assert_eq!(out, b"Bearer value-of-TOKEN and value-of-TOKEN");
        assert!(insert(&s, "a.example.org", 80, req.as_bytes()).is_some());
        assert!(insert(&s, "evil.com", 443, req.as_bytes()).is_none());
        assert!(insert(&s, "x.com", 443, s[1].placeholder.as_bytes()).is_none());
        assert!(insert(&s, "x.com", 8443, s[1].placeholder.as_bytes()).is_some());
        let back = scrub(&s, b"echo: value-of-TOKEN, value-of-OTHER!".to_vec());
        assert_eq!(
            back,
            format!("echo: {p}, {}!", s[1].placeholder).into_bytes()
        );
        assert_eq!(scrub(&s, b"nothing".to_vec()), b"nothing");
    }

    #[test]
    fn bad_settings_name_the_setting() {
        for (spec, why) in [
            ("TOKEN", "names no hosts"),
            ("TO-KEN@x.com", "is not a variable name"),
            ("MISSING@x.com", "is not set"),
            ("TOKEN@*", "host pattern"),
        ] {
            let e = parse(spec, |n| (n == "TOKEN").then(|| "v".to_string()))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(SECRETS) && e.contains(why), "{spec}: {e}");
        }
    }
}
