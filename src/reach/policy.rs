//! Which hosts a guest's requests may go to: the server's list (`WASMBOX_ALLOW_HOSTS`), which
//! a sandbox or a call may narrow but never widen.

use std::fmt;

/// The setting a refusal names, so the person reading it knows what to change.
pub const ALLOW_HOSTS: &str = "WASMBOX_ALLOW_HOSTS";

/// One entry of an allowlist: `example.com`, `*.example.com` (its subdomains, not itself),
/// `127.0.0.1`, `[::1]`, each with an optional `:port` (without one, any port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPattern {
    /// Lower case, without a trailing dot; an IPv6 address without its brackets.
    name: String,
    wildcard: bool,
    port: Option<u16>,
}

/// A host pattern that does not parse, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("host pattern {text:?}: {why}")]
pub struct BadPattern {
    text: String,
    why: &'static str,
}

impl HostPattern {
    pub fn parse(text: &str) -> Result<Self, BadPattern> {
        let bad = |why: &'static str| BadPattern {
            text: text.to_string(),
            why,
        };
        let t = text.trim();
        let (host, port) = if let Some(rest) = t.strip_prefix('[') {
            let (h, tail) = rest.split_once(']').ok_or_else(|| bad("no closing ]"))?;
            let port = match tail {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?),
            };
            (h, port)
        } else {
            match t.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (t, None),
            }
        };
        let port = match port {
            None => None,
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?,
            ),
        };
        let (wildcard, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if name.is_empty() {
            return Err(bad("no host"));
        }
        if name.contains('*') {
            return Err(bad(
                "a wildcard may only be the first label, as in *.example.com",
            ));
        }
        let ip = name.parse::<std::net::IpAddr>().is_ok();
        if !ip
            && !name.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
        {
            return Err(bad("not a host name or address"));
        }
        if wildcard && ip {
            return Err(bad("a wildcard needs a domain, not an address"));
        }
        Ok(Self {
            name,
            wildcard,
            port,
        })
    }

    /// Whether a request to `host:port` (as a URL gives them: lower case, IPv6 without brackets)
    /// fits this entry.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        let host = host.trim_end_matches('.');
        let name_fits = if self.wildcard {
            host.len() > self.name.len()
                && host.ends_with(self.name.as_str())
                && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
        } else {
            host.eq_ignore_ascii_case(&self.name)
        };
        name_fits && self.port.is_none_or(|p| p == port)
    }

    /// Whether every request `other` lets through, this lets through too.
    pub fn covers(&self, other: &HostPattern) -> bool {
        let ports = self.port.is_none() || self.port == other.port;
        let names = match (self.wildcard, other.wildcard) {
            (false, false) => self.name == other.name,
            (false, true) => false,
            (true, _) => {
                other.name.len() > self.name.len()
                    && other.name.ends_with(self.name.as_str())
                    && other.name.as_bytes()[other.name.len() - self.name.len() - 1] == b'.'
                    || (other.wildcard && other.name == self.name)
            }
        };
        ports && names
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        if self.name.contains(':') {
            write!(f, "[{}]", self.name)?;
        } else {
            f.write_str(&self.name)?;
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

/// A list of host patterns (comma- or whitespace-separated in settings).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostList(Vec<HostPattern>);

impl HostList {
    pub fn parse(text: &str) -> Result<Self, BadPattern> {
        text.split([',', ' ', '\n', '\t'])
            .filter(|s| !s.trim().is_empty())
            .map(HostPattern::parse)
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    pub fn from_items<S: AsRef<str>>(items: &[S]) -> Result<Self, BadPattern> {
        items
            .iter()
            .map(|s| HostPattern::parse(s.as_ref()))
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    pub fn from_patterns(patterns: Vec<HostPattern>) -> Self {
        Self(patterns)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, host: &str, port: u16) -> bool {
        self.0.iter().any(|p| p.matches(host, port))
    }

    /// `narrower` if every entry of it is within this list; otherwise the first that is not.
    pub fn narrow(&self, narrower: HostList) -> Result<HostList, HostPattern> {
        match narrower
            .0
            .iter()
            .find(|n| !self.0.iter().any(|p| p.covers(n)))
        {
            Some(wider) => Err(wider.clone()),
            None => Ok(narrower),
        }
    }

    pub fn items(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

impl fmt::Display for HostList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.items().join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> HostPattern {
        HostPattern::parse(s).unwrap()
    }

    #[test]
    fn patterns_match_hosts_and_ports() {
        assert!(p("example.com").matches("example.com", 443));
        assert!(p("Example.COM.").matches("example.com", 80));
        assert!(!p("example.com").matches("api.example.com", 443));
        assert!(!p("example.com").matches("badexample.com", 443));
        assert!(p("*.example.com").matches("api.example.com", 443));
        assert!(p("*.example.com").matches("a.b.example.com", 443));
        assert!(!p("*.example.com").matches("example.com", 443));
        assert!(!p("*.example.com").matches("badexample.com", 443));
        assert!(!p("*.example.com").matches("example.com.evil.net", 443));
        assert!(p("example.com:8080").matches("example.com", 8080));
        assert!(!p("example.com:8080").matches("example.com", 80));
        assert!(p("127.0.0.1:9").matches("127.0.0.1", 9));
        assert!(p("[::1]:80").matches("::1", 80));
        assert!(p("[::1]").matches("::1", 1));
        for bad in [
            "",
            "*",
            "*.",
            "a.*.com",
            "ex ample.com",
            "example.com:0",
            "example.com:x",
            "*.1.2.3.4",
            "[::1",
            "a..b",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn narrowing_never_widens() {
        let server = HostList::parse("*.example.com, api.github.com:443").unwrap();
        assert!(
            server
                .narrow(HostList::parse("api.example.com").unwrap())
                .is_ok()
        );
        assert!(
            server
                .narrow(HostList::parse("*.x.example.com").unwrap())
                .is_ok()
        );
        assert!(
            server
                .narrow(HostList::parse("*.example.com").unwrap())
                .is_ok()
        );
        assert!(
            server
                .narrow(HostList::parse("api.github.com:443").unwrap())
                .is_ok()
        );
        assert_eq!(
            server
                .narrow(HostList::parse("api.github.com").unwrap())
                .unwrap_err()
                .to_string(),
            "api.github.com"
        );
        assert!(
            server
                .narrow(HostList::parse("example.com").unwrap())
                .is_err()
        );
        assert!(server.narrow(HostList::parse("evil.com").unwrap()).is_err());
        assert!(
            HostList::default()
                .narrow(HostList::parse("a.com").unwrap())
                .is_err()
        );
        assert!(HostList::default().narrow(HostList::default()).is_ok());
    }

    use crate::testing::Rng;

    const LABELS: &[&str] = &["a", "b", "example", "com", "api", "ex-ample", "xn--p1ai"];
    const PORTS: &[Option<u16>] = &[None, Some(80), Some(443), Some(8080)];

    fn name(r: &mut Rng) -> String {
        let n = 1 + r.below(4) as usize;
        (0..n)
            .map(|_| LABELS[r.below(LABELS.len() as u64) as usize])
            .collect::<Vec<_>>()
            .join(".")
    }

    fn pattern(r: &mut Rng) -> String {
        let wild = if r.below(2) == 0 { "*." } else { "" };
        let port =
            PORTS[r.below(PORTS.len() as u64) as usize].map_or(String::new(), |p| format!(":{p}"));
        format!("{wild}{}{port}", name(r))
    }

    /// Whatever a narrowing accepts, every host it lets through the server's list lets through
    /// too; and a list narrowed to itself lets through exactly the same hosts.
    #[test]
    fn a_narrowed_list_never_lets_through_a_host_the_server_refuses() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        let mut accepted = 0;
        for _ in 0..3000 {
            let server_items: Vec<String> = (0..1 + r.below(3)).map(|_| pattern(&mut r)).collect();
            // Asks near the server's entries (a subdomain, a port, the wildcard dropped or
            // added), so that many fit and the check has something to check.
            let ask_items: Vec<String> = (0..1 + r.below(3))
                .map(|_| {
                    let base = &server_items[r.below(server_items.len() as u64) as usize];
                    match r.below(5) {
                        0 => pattern(&mut r),
                        1 => base.clone(),
                        2 => format!(
                            "*.{}.{}",
                            LABELS[r.below(LABELS.len() as u64) as usize],
                            base.trim_start_matches("*.")
                        ),
                        3 => base.trim_start_matches("*.").to_string(),
                        _ => format!(
                            "{}:{}",
                            base.split(':').next().unwrap(),
                            [80, 443, 8080][r.below(3) as usize]
                        ),
                    }
                })
                .collect();
            let server = HostList::parse(&server_items.join(",")).unwrap();
            let ask = HostList::parse(&ask_items.join(",")).unwrap();
            // Hosts near both lists' names, and random ones.
            let hosts: Vec<(String, u16)> = (0..40)
                .map(|_| {
                    let near = &ask_items[r.below(ask_items.len() as u64) as usize];
                    let n = near.split(':').next().unwrap().trim_start_matches("*.");
                    let h = match r.below(3) {
                        0 => name(&mut r),
                        1 => n.to_string(),
                        _ => format!("{}.{n}", LABELS[r.below(LABELS.len() as u64) as usize]),
                    };
                    (h, [80, 443, 8080, 9][r.below(4) as usize])
                })
                .collect();
            if let Ok(narrow) = server.narrow(ask.clone()) {
                accepted += 1;
                for (h, p) in &hosts {
                    assert!(
                        !narrow.matches(h, *p) || server.matches(h, *p),
                        "{h}:{p} passes {narrow} but not {server}"
                    );
                }
            }
            let same = server
                .narrow(server.clone())
                .expect("a list narrows to itself");
            for (h, p) in &hosts {
                assert_eq!(same.matches(h, *p), server.matches(h, *p));
            }
        }
        assert!(
            accepted > 300,
            "too few narrowings were accepted to test: {accepted}"
        );
    }
}
