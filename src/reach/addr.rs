//! Which addresses are inside the machine's networks: a request the server makes for someone
//! else (a webhook, a guest's HTTP) must not reach them unless the person running it said so.

use std::error::Error;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

/// What makes `ip` (canonical: IPv4-mapped IPv6 is IPv4) an address inside the machine's
/// networks rather than a host on the internet, if anything does.
pub fn private_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => private_v4(v4),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let embedded = |hi: usize| {
                let (a, b) = (s[hi], s[hi + 1]);
                Ipv4Addr::new((a >> 8) as u8, a as u8, (b >> 8) as u8, b as u8)
            };
            let via = |v4: Ipv4Addr, what: &'static str| {
                (v4.is_loopback() || private_v4(v4).is_some()).then_some(what)
            };
            if v6.is_unspecified() {
                Some("the unspecified address")
            } else if s[0] & 0xfe00 == 0xfc00 {
                Some("a unique local (private) address, like AWS's metadata fd00:ec2::254")
            } else if s[0] & 0xffc0 == 0xfe80 || s[0] & 0xffc0 == 0xfec0 {
                Some("a link-local address")
            } else if s[0] & 0xff00 == 0xff00 {
                Some("a multicast address")
            } else if s[..6] == [0; 6] {
                via(embedded(6), "an IPv4-compatible address of a private one")
            } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || s[..3] == [0x64, 0xff9b, 1] {
                via(embedded(6), "a NAT64 address of a private one")
            } else if s[0] == 0x2002 {
                via(embedded(1), "a 6to4 address of a private one")
            } else {
                None
            }
        }
    }
}

fn private_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, ..) => "the unspecified (\"this network\") address range 0.0.0.0/8",
        (10, ..) | (192, 168, _) => "a private address",
        (172, 16..=31, _) => "a private address",
        (100, 64..=127, _) => "a shared (CGNAT) address, like Alibaba's metadata 100.100.100.200",
        (169, 254, _) => "a link-local address, where cloud metadata services live",
        (192, 0, 0) => "an IETF protocol address, like Oracle's metadata 192.0.0.192",
        (224..=239, ..) => "a multicast address",
        (240..=255, ..) => "a reserved or broadcast address",
        _ => return None,
    })
}

/// Host name lookups, replaceable in tests (which may not resolve anything real).
pub type Lookup = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>
        + Send
        + Sync,
>;

/// Whether a request may connect to an address, and if not, why (each check's own error).
pub type IpCheck = Arc<dyn Fn(IpAddr) -> Result<(), Box<dyn Error + Send + Sync>> + Send + Sync>;

/// The system's resolver.
pub fn system_lookup() -> Lookup {
    Arc::new(|host| {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    })
}

/// Why a request was refused at resolution: found in the error's chain by [`refusal`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// A reqwest resolver that hands reqwest only addresses its check allows; one refused address
/// refuses the name (a rebinding name may list a public address first and a private one next).
struct Checked {
    check: IpCheck,
    lookup: Lookup,
}

impl reqwest::dns::Resolve for Checked {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        let check = self.check.clone();
        let found = (self.lookup)(host.clone());
        Box::pin(async move {
            let ips = found.await?;
            if ips.is_empty() {
                return Err(Refused(format!("{host} resolves to no address")).into());
            }
            for ip in &ips {
                check(*ip).map_err(|why| Refused(format!("{host} resolves to {why}")))?;
            }
            let addrs = ips.into_iter().map(|ip| SocketAddr::new(ip, 0));
            Ok(Box::new(addrs) as reqwest::dns::Addrs)
        })
    }
}

/// A client for requests the server makes for someone else: names resolve through `check`
/// (where the connection then goes), reqwest follows no redirect (the caller decides), and no
/// proxy is used (one would resolve the name where the check cannot see).
pub fn checked_client(check: IpCheck, lookup: Lookup) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .user_agent(concat!("wasmbox/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(Checked { check, lookup }))
        .build()
}

/// The resolver's refusal, if that is what ended a request.
pub fn refusal<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a Refused> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Refused>() {
            return Some(r);
        }
        cur = err.source();
    }
    None
}
