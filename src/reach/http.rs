//! A guest's HTTP request, made by the host: only to allowed hosts, every address a name
//! resolves to checked (as webhooks' are), redirects followed by hand so that each hop is
//! checked again, the body read up to its cap. No proxy: one would resolve names where the
//! check cannot see.

use std::net::IpAddr;
use std::sync::Arc;

use reqwest::Url;
use serde::{Deserialize, Serialize};

use super::addr::{checked_client, private_kind, refusal, system_lookup};
use super::{ALLOW_HOSTS, ALLOW_PRIVATE, Reach, secrets};

/// Redirects followed for one request, as browsers and reqwest's own default do (10).
const MAX_REDIRECTS: usize = 10;

/// What the guest asks for (the head of its frame; the body follows it).
#[derive(Debug, Deserialize)]
pub struct Request {
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
}

/// What it gets back (the head of the answer; the body follows it).
#[derive(Debug, Serialize)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    /// The URL answered, after redirects.
    pub url: String,
    pub headers: Vec<(String, String)>,
}

/// Why a request got no response, with the kind the guest's shim turns into its language's
/// error (`refused`: a connection refused; `too_large`, `failed`: an OS error).
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub kind: &'static str,
    pub message: String,
}

impl Failure {
    pub fn new(kind: &'static str, message: String) -> Self {
        Self { kind, message }
    }

    pub fn refused(message: String) -> Self {
        Self::new("refused", message)
    }

    fn failed(message: String) -> Self {
        Self::new("failed", message)
    }

    pub fn too_large(message: String) -> Self {
        Self::new("too_large", message)
    }
}

/// Whether `reach` lets a request go to `url`; the refusal names the host and the setting.
pub fn check_url(reach: &Reach, url: &Url) -> Result<(), Failure> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Failure::refused(format!(
            "{url}: only http and https requests leave the sandbox"
        )));
    }
    let (host, ip) = match url.host() {
        Some(url::Host::Domain(d)) => (d.to_ascii_lowercase(), None),
        Some(url::Host::Ipv4(ip)) => (ip.to_string(), Some(IpAddr::V4(ip))),
        Some(url::Host::Ipv6(ip)) => (ip.to_string(), Some(IpAddr::V6(ip))),
        None => return Err(Failure::refused(format!("{url}: no host"))),
    };
    let port = url.port_or_known_default().unwrap_or(0);
    if !reach.hosts.matches(&host, port) {
        let list = if reach.hosts.is_empty() && !reach.narrowed {
            format!(
                "guest network is off; set {ALLOW_HOSTS} (for example {ALLOW_HOSTS}={host}) to allow it"
            )
        } else if reach.narrowed {
            format!(
                "this sandbox's allow_hosts ({}) does not include it",
                reach.hosts
            )
        } else {
            format!("{ALLOW_HOSTS}={} does not include it", reach.hosts)
        };
        return Err(Failure::refused(format!(
            "{host}:{port} is not an allowed host: {list}"
        )));
    }
    if let Some(ip) = ip {
        check_ip(ip, reach.config.allow_private)
            .map_err(|why| Failure::refused(format!("{host}: {why}")))?;
    }
    Ok(())
}

/// An address inside the machine's networks, which a guest's request may not reach.
#[derive(Debug, thiserror::Error)]
#[error("{ip} is {kind}, inside the machine's networks: refused unless {ALLOW_PRIVATE}=1")]
struct PrivateAddr {
    ip: IpAddr,
    kind: &'static str,
}

/// Whether a guest's request may connect to `ip`, and if not, why.
fn check_ip(ip: IpAddr, allow_private: bool) -> Result<(), PrivateAddr> {
    if allow_private {
        return Ok(());
    }
    let ip = ip.to_canonical();
    let kind = if ip.is_loopback() {
        Some("a loopback address")
    } else {
        private_kind(ip)
    };
    match kind {
        Some(kind) => Err(PrivateAddr { ip, kind }),
        None => Ok(()),
    }
}

/// The client guests' requests go through.
pub fn client(allow_private: bool) -> reqwest::Result<reqwest::Client> {
    checked_client(
        Arc::new(move |ip| Ok(check_ip(ip, allow_private)?)),
        system_lookup(),
    )
}

/// Headers the host sets itself: the guest's would describe a connection it does not have.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name.to_ascii_lowercase().as_str(),
        "host"
            | "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "upgrade"
    )
}

/// Makes `req` with `body`, following redirects to allowed hosts, and reads the response's
/// body up to `WASMBOX_HTTP_BYTES`.
pub async fn fetch(
    reach: &Reach,
    req: Request,
    body: Vec<u8>,
) -> Result<(Response, Vec<u8>), Failure> {
    let cap = reach.config.http_bytes;
    let mut url =
        Url::parse(&req.url).map_err(|e| Failure::failed(format!("{:?}: {e}", req.url)))?;
    let mut method = reqwest::Method::from_bytes(req.method.as_bytes())
        .map_err(|_| Failure::failed(format!("{:?} is not an HTTP method", req.method)))?;
    for (k, v) in &req.headers {
        if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(v).is_err()
        {
            return Err(Failure::failed(format!(
                "header {k:?} is not a valid HTTP header"
            )));
        }
    }
    // The guest's own forms (placeholders, not secrets): each hop gets the secrets its host
    // may have, and a hop to another host loses the credentials meant for the first.
    let mut headers: Vec<(String, String)> = req
        .headers
        .into_iter()
        .filter(|(k, _)| !hop_by_hop(k))
        .collect();
    let mut body = Some(body).filter(|b| !b.is_empty());
    for _ in 0..=MAX_REDIRECTS {
        check_url(reach, &url)?;
        let (host, port) = secrets::host_port(&url);
        let secrets = &reach.config.secrets;
        let with = |b: &[u8]| secrets::insert(secrets, &host, port, b);
        let target = match with(url.as_str().as_bytes()) {
            Some(u) => {
                let t = Url::parse(&String::from_utf8_lossy(&u)).map_err(|_| {
                    Failure::failed(format!("{url}: the URL with its secrets does not parse"))
                })?;
                // A value with `@` or `/` in it must not move the request to another host.
                if !same_host(&t, &url) {
                    return Err(Failure::refused(format!(
                        "{url}: a secret's value would change the URL's host; refused"
                    )));
                }
                t
            }
            None => url.clone(),
        };
        let mut map = reqwest::header::HeaderMap::new();
        for (k, v) in &headers {
            let v = with(v.as_bytes()).unwrap_or_else(|| v.as_bytes().to_vec());
            let (Ok(k), Ok(v)) = (
                reqwest::header::HeaderName::from_bytes(k.as_bytes()),
                reqwest::header::HeaderValue::from_bytes(&v),
            ) else {
                return Err(Failure::failed(format!(
                    "header {k:?} is not a valid HTTP header"
                )));
            };
            map.append(k, v);
        }
        let mut rb = reach.client.request(method.clone(), target).headers(map);
        if let Some(b) = &body {
            rb = rb.body(with(b).unwrap_or_else(|| b.clone()));
        }
        let resp = rb.send().await.map_err(|e| failure(&url, &e))?;
        let status = resp.status();
        if status.is_redirection()
            && let Some(to) = resp.headers().get(reqwest::header::LOCATION)
        {
            // The Location is the guest's form again (a host may echo what it was sent, the
            // value included) before the next hop is decided: that hop's own secrets are put in
            // at its turn, and only if it is one of their hosts.
            let to = to
                .to_str()
                .ok()
                .map(|l| {
                    String::from_utf8_lossy(&secrets::scrub(secrets, l.as_bytes().to_vec()))
                        .into_owned()
                })
                .and_then(|l| url.join(&l).ok())
                .ok_or_else(|| {
                    Failure::failed(format!("{url} redirects to an unreadable Location"))
                })?;
            if let Some(s) = secrets::carried(secrets, &to) {
                return Err(Failure::refused(format!(
                    "{url} redirects to {}, carrying the value of secret {} in a form the host cannot put back; refused: {} goes only to its own hosts ({})",
                    to.host_str().unwrap_or(""),
                    s.name,
                    s.name,
                    s.hosts
                )));
            }
            check_url(reach, &to).map_err(|f| {
                Failure::refused(format!(
                    "{url} redirects to {to}, which is refused: {}",
                    f.message
                ))
            })?;
            // 303, and 301/302 after a POST, become a GET without a body (as browsers do).
            if status == reqwest::StatusCode::SEE_OTHER
                || (matches!(status.as_u16(), 301 | 302) && method == reqwest::Method::POST)
            {
                method = reqwest::Method::GET;
                body = None;
                headers.retain(|(k, _)| !k.eq_ignore_ascii_case("content-type"));
            }
            if !same_host(&to, &url) {
                // Credentials meant for one host are not handed to the next.
                headers.retain(|(k, _)| {
                    !k.eq_ignore_ascii_case("authorization") && !k.eq_ignore_ascii_case("cookie")
                });
            }
            url = to;
            continue;
        }
        if resp.content_length().is_some_and(|n| n > cap as u64) {
            return Err(too_large(&url, cap));
        }
        let head = Response {
            status: status.as_u16(),
            reason: status.canonical_reason().unwrap_or("").to_string(),
            // The guest's form: the URL sent carries the values (percent-encoded, past scrubbing).
            url: url.to_string(),
            headers: resp
                .headers()
                .iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "transfer-encoding" | "connection" | "content-length"
                    )
                })
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
        };
        let mut resp = resp;
        let mut out = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| failure(&url, &e))? {
            if out.len() + chunk.len() > cap {
                return Err(too_large(&url, cap));
            }
            out.extend_from_slice(&chunk);
        }
        return Ok((head, out));
    }
    Err(Failure::failed(format!(
        "{url}: more than {MAX_REDIRECTS} redirects"
    )))
}

/// Whether `a` and `b` name the same host and port.
fn same_host(a: &Url, b: &Url) -> bool {
    a.host_str() == b.host_str() && a.port_or_known_default() == b.port_or_known_default()
}

fn too_large(url: &Url, cap: usize) -> Failure {
    Failure::too_large(format!(
        "{url}: the response body is over WASMBOX_HTTP_BYTES ({cap} bytes)"
    ))
}

/// A failed request: refused by the resolver's check, or a network error.
fn failure(url: &Url, e: &reqwest::Error) -> Failure {
    if let Some(r) = refusal(e) {
        return Failure::refused(r.0.clone());
    }
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    Failure::failed(format!("{url}: {msg}"))
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use axum::http::{HeaderMap, StatusCode, Uri, header};
    use axum::response::IntoResponse;
    use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

    use super::*;
    use crate::reach::{HostList, ReachConfig, secrets};

    use crate::testing::Rng;

    /// Where a host puts what it was sent in the next URL, and how it writes it.
    #[derive(Debug, Clone, Copy)]
    enum Place {
        Path,
        Query,
        Fragment,
    }
    #[derive(Debug, Clone, Copy)]
    enum Writing {
        AsReceived,
        Decoded,
        Component,
        Form,
        Twice,
    }

    #[derive(Debug, Clone)]
    enum Step {
        Redirect(u16, usize, Place, Writing),
        Answer,
    }

    #[derive(Default)]
    struct Script {
        steps: VecDeque<Step>,
        /// (host index, the request line's target and every header) of each request.
        seen: Vec<(usize, String)>,
    }

    /// An open redirect on each of `n` hosts: each request is logged whole, then answered with
    /// the script's next step, which echoes what was sent into the next hop's URL.
    async fn hosts(n: usize, script: Arc<Mutex<Script>>) -> Vec<u16> {
        let mut listeners = Vec::new();
        for _ in 0..n {
            listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        for (i, l) in listeners.into_iter().enumerate() {
            let (script, ports) = (script.clone(), ports.clone());
            let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
                let (script, ports) = (script.clone(), ports.clone());
                async move {
                    let sent = uri.to_string();
                    let mut whole = sent.clone();
                    for (k, v) in &headers {
                        whole
                            .push_str(&format!("\n{k}: {}", String::from_utf8_lossy(v.as_bytes())));
                    }
                    let mut s = script.lock().unwrap();
                    s.seen.push((i, whole));
                    let Some(Step::Redirect(status, to, place, writing)) = s.steps.pop_front()
                    else {
                        return (StatusCode::OK, sent).into_response();
                    };
                    let decoded = percent_decode_str(&sent).decode_utf8_lossy().into_owned();
                    let echo = match writing {
                        Writing::AsReceived => sent.clone(),
                        Writing::Decoded => decoded,
                        Writing::Component => {
                            utf8_percent_encode(&decoded, NON_ALPHANUMERIC).to_string()
                        }
                        Writing::Form => {
                            url::form_urlencoded::byte_serialize(decoded.as_bytes()).collect()
                        }
                        Writing::Twice => utf8_percent_encode(&sent, NON_ALPHANUMERIC).to_string(),
                    };
                    let base = format!("http://127.0.0.1:{}", ports[to]);
                    let location = match place {
                        Place::Path => format!("{base}/p/{echo}"),
                        Place::Query => format!("{base}/q?to={echo}"),
                        Place::Fragment => format!("{base}/f#{echo}"),
                    };
                    let status = StatusCode::from_u16(status).unwrap();
                    (status, [(header::LOCATION, location)]).into_response()
                }
            });
            tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        }
        ports
    }

    /// `text` carries `value` as sent, or after up to three rounds of decoding (`+` a space).
    fn carries(text: &str, value: &str) -> bool {
        let mut t = text.to_string();
        for _ in 0..4 {
            if t.contains(value) || t.replace('+', " ").contains(value) {
                return true;
            }
            t = percent_decode_str(&t).decode_utf8_lossy().into_owned();
        }
        false
    }

    /// Random redirect chains over a secret's host and two other allowed hosts, each an open
    /// redirect echoing what it was sent (the value included) into the next URL's path, query
    /// or fragment, as sent, decoded or encoded again: no request to a host other than the
    /// secret's ever carries its value, in the URL or a header, and the guest's answer never
    /// names it.
    #[tokio::test]
    async fn a_secret_never_rides_a_redirect_to_another_host() {
        let script = Arc::new(Mutex::new(Script::default()));
        let ports = hosts(3, script.clone()).await;
        let mut config = ReachConfig::from_env();
        config.error = None;
        config.allow_private = true;
        config.hosts = HostList::parse(
            &ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(","),
        )
        .unwrap();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        let mut r = Rng(seed);
        let mut delivered = 0;
        for value in ["s3cr3tValue9f2c", "tok en/\u{e4}&x=1+y;@", "a%2Fb?c#d"] {
            config.secrets = secrets::parse(&format!("TOKEN@127.0.0.1:{}", ports[0]), |_| {
                Some(value.to_string())
            })
            .unwrap();
            let placeholder = config.secrets[0].placeholder.clone();
            let reach = Reach::new(config.clone()).unwrap();
            for round in 0..60 {
                let steps: VecDeque<Step> = (0..r.below(12))
                    .map(|_| {
                        let status = [301, 302, 303, 307, 308][r.below(5) as usize];
                        let place =
                            [Place::Path, Place::Query, Place::Fragment][r.below(3) as usize];
                        let writing = [
                            Writing::AsReceived,
                            Writing::Decoded,
                            Writing::Component,
                            Writing::Form,
                            Writing::Twice,
                        ][r.below(5) as usize];
                        Step::Redirect(status, r.below(3) as usize, place, writing)
                    })
                    .chain([Step::Answer])
                    .collect();
                let first = r.below(3) as usize;
                let url = match r.below(3) {
                    0 => format!("http://127.0.0.1:{}/start/{placeholder}", ports[first]),
                    1 => format!(
                        "http://127.0.0.1:{}/start?t={placeholder}&x=1",
                        ports[first]
                    ),
                    _ => format!("http://127.0.0.1:{}/start#{placeholder}", ports[first]),
                };
                let why =
                    format!("seed {seed:#x}, value {value:?}, round {round}, {url}, {steps:?}");
                {
                    let mut s = script.lock().unwrap();
                    s.steps = steps;
                    s.seen.clear();
                }
                let req = Request {
                    method: ["GET", "POST"][r.below(2) as usize].to_string(),
                    url,
                    headers: vec![
                        ("Authorization".into(), format!("Bearer {placeholder}")),
                        ("X-Token".into(), placeholder.clone()),
                    ],
                };
                let body = format!("token={placeholder}").into_bytes();
                let answer = fetch(&reach, req, body).await;
                let seen = std::mem::take(&mut script.lock().unwrap().seen);
                for (host, whole) in &seen {
                    if *host == 0 {
                        delivered += usize::from(carries(whole, value));
                    } else {
                        assert!(
                            !carries(whole, value),
                            "host {host} got the value: {whole}\n{why}"
                        );
                    }
                }
                let told = match answer {
                    Ok((head, body)) => format!(
                        "{} {:?} {}",
                        head.url,
                        head.headers,
                        String::from_utf8_lossy(&secrets::scrub(&reach.config.secrets, body))
                    ),
                    Err(f) => String::from_utf8_lossy(&secrets::scrub(
                        &reach.config.secrets,
                        f.message.into_bytes(),
                    ))
                    .into_owned(),
                };
                assert!(
                    !told.contains(value),
                    "the guest is told the value: {told}\n{why}"
                );
            }
        }
        assert!(delivered > 0, "the secret's own host never got the value");
    }
}
