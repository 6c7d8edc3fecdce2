//! Secrets kept on the host (`WASMBOX_SECRETS`): the guest sees a placeholder in its
//! environment; the host puts the value into requests to that secret's hosts only, and puts the
//! placeholder back wherever the value appears in what a host call answers. The answer is the
//! only way anything of the host's reaches a guest, so the value cannot reach its output, its
//! files, its jobs or its saved state.

use super::policy::{HostList, HostPattern};

/// The setting, for errors that name it.
pub const SECRETS: &str = "WASMBOX_SECRETS";

#[derive(Clone)]
pub struct Secret {
    /// The variable's name, in the host's environment and the guest's.
    pub name: String,
    value: Vec<u8>,
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

/// Reads `WASMBOX_SECRETS`: comma-separated `NAME@host[|host...]`, each `NAME` a variable of
/// the server's environment.
pub fn from_env() -> Result<Vec<Secret>, String> {
    let Ok(spec) = std::env::var(SECRETS) else {
        return Ok(Vec::new());
    };
    parse(&spec, |name| std::env::var(name).ok())
}

fn parse(spec: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<Vec<Secret>, String> {
    let tag: [u8; 8] = rand_bytes();
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            let (name, hosts) = entry.split_once('@').ok_or_else(|| {
                format!("{SECRETS}: {entry:?} names no hosts (NAME@host, e.g. GITHUB_TOKEN@api.github.com)")
            })?;
            let name = name.trim();
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("{SECRETS}: {name:?} is not a variable name"));
            }
            let hosts = hosts
                .split('|')
                .map(HostPattern::parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{SECRETS}: {e}"))?;
            let value = lookup(name)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("{SECRETS}: {name} is not set in the server's environment"))?;
            Ok(Secret {
                name: name.to_string(),
                value: value.into_bytes(),
                placeholder: format!("WASMBOX_SECRET_{name}_{tag}"),
                hosts: HostList::from_patterns(hosts),
            })
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

/// `bytes` with every secret's value replaced by its placeholder.
pub fn scrub(secrets: &[Secret], bytes: Vec<u8>) -> Vec<u8> {
    secrets.iter().fold(bytes, |b, s| {
        replaced(&b, &s.value, s.placeholder.as_bytes()).unwrap_or(b)
    })
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
            let e = parse(spec, |n| (n == "TOKEN").then(|| "v".to_string())).unwrap_err();
            assert!(e.starts_with(SECRETS) && e.contains(why), "{spec}: {e}");
        }
    }
}
