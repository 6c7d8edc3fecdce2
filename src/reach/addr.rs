//! Which addresses are inside the machine's networks: a request the server makes for someone
//! else (a webhook, a guest's HTTP) must not reach them unless the person running it said so.

use std::net::{IpAddr, Ipv4Addr};

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
