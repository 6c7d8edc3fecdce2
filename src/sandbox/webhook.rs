//! Async executions report to a webhook: the result is POSTed as JSON, signed with HMAC-SHA256
//! over `<timestamp>.<body>` (headers `X-Wasmbox-Timestamp`, `X-Wasmbox-Signature:
//! sha256=<hex>`), so a receiver can check it came from this server and is fresh.
//!
//! A webhook is a request this server makes from inside the user's network, so where it may go
//! is checked twice: the URL when the call is made ([`check_url`]), and every address a host
//! name resolves to when the result is delivered ([`client`]'s resolver), which is also where
//! the connection then goes. A name that resolves (or is re-pointed, DNS rebinding) to a
//! private address is refused like the address itself.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use reqwest::Url;
use sha2::Sha256;

use crate::config::WebhookConfig;
use crate::reach::addr::{Lookup, checked_client, private_kind, refusal, system_lookup};
use crate::{Error, Result};

/// The most of a webhook's reply that is read (for the log); the rest is never read.
const REPLY_CAP: usize = 64 << 10;

const LOOPBACK_ONLY: &str = "only loopback hosts (localhost, 127.0.0.0/8, ::1) are allowed; set WASMBOX_WEBHOOK_ALLOW_ANY=1 to allow others";

/// Checks a callback URL: http(s); a loopback host unless any host is allowed; and then, for an
/// address, none of the private kinds unless those are allowed too. Host names are checked
/// again, by address, at delivery.
pub fn check_url(url: &str, cfg: &WebhookConfig) -> Result<Url> {
    let bad = |why: &str| Error::Webhook(format!("Invalid callback_url {url:?}: {why}"));
    let parsed = Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("only http and https URLs are allowed"));
    }
    let ip = match parsed.host() {
        Some(url::Host::Domain(d)) => {
            if !d.eq_ignore_ascii_case("localhost") && !cfg.allow_any_host {
                return Err(bad(LOOPBACK_ONLY));
            }
            return Ok(parsed);
        }
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
        None => return Err(bad("it has no host")),
    };
    check_ip(ip, cfg).map_err(|why| bad(&why.to_string()))?;
    Ok(parsed)
}

/// Why a webhook may not reach an address.
#[derive(Debug, thiserror::Error)]
enum AddrRefused {
    #[error("{LOOPBACK_ONLY}")]
    NotLoopback,
    #[error(
        "{ip} is {kind}; such addresses stay refused under WASMBOX_WEBHOOK_ALLOW_ANY=1 unless WASMBOX_WEBHOOK_ALLOW_PRIVATE=1 is set too"
    )]
    Private { ip: IpAddr, kind: &'static str },
}

/// Whether a webhook may reach `ip`, and if not, why.
fn check_ip(ip: IpAddr, cfg: &WebhookConfig) -> std::result::Result<(), AddrRefused> {
    let ip = ip.to_canonical();
    if ip.is_loopback() {
        return Ok(());
    }
    if !cfg.allow_any_host {
        return Err(AddrRefused::NotLoopback);
    }
    match private_kind(ip) {
        Some(kind) if !cfg.allow_private => Err(AddrRefused::Private { ip, kind }),
        _ => Ok(()),
    }
}

/// The client that delivers webhooks: names resolve through [`check_ip`]; no redirects (a 3xx
/// is logged, not followed: a 307 would re-send the signed result wherever it points); no
/// proxy (one would resolve the name where the check cannot see).
pub fn client(cfg: &WebhookConfig) -> reqwest::Result<reqwest::Client> {
    client_with(cfg, system_lookup())
}

fn client_with(cfg: &WebhookConfig, lookup: Lookup) -> reqwest::Result<reqwest::Client> {
    let cfg = cfg.clone();
    checked_client(Arc::new(move |ip| Ok(check_ip(ip, &cfg)?)), lookup)
}

/// The signing key: configured, or a random one kept in `<cache>/webhook-secret` (mode 0600)
/// so receivers can read it and it survives restarts.
pub fn secret(cfg: &WebhookConfig, cache_dir: &Path) -> Vec<u8> {
    if let Some(s) = &cfg.secret {
        return s.as_bytes().to_vec();
    }
    let path = cache_dir.join("webhook-secret");
    if let Ok(s) = std::fs::read_to_string(&path)
        && s.trim().len() >= 32
    {
        return s.trim().as_bytes().to_vec();
    }
    let fresh = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let written = std::fs::create_dir_all(cache_dir).and_then(|()| {
        use std::io::Write;
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true);
        crate::platform::fs::private_file(&mut o);
        o.open(&path)?.write_all(fresh.as_bytes())
    });
    if let Err(e) = written {
        tracing::warn!("webhook secret not saved to {}: {e}", path.display());
    }
    fresh.into_bytes()
}

/// `sha256=<hex>` of HMAC-SHA256(key, "<timestamp>.<body>").
pub fn sign(key: &[u8], timestamp: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// POSTs `payload`, retrying a few times on network errors and 5xx (delivery is idempotent for
/// us: the execution is not re-run). A refused address or a redirect ends it at once.
pub async fn deliver(client: &reqwest::Client, url: Url, key: &[u8], payload: serde_json::Value) {
    let body = serde_json::to_vec(&payload).expect("JSON always serialises");
    let id = payload["execution_id"].as_str().unwrap_or("").to_string();
    for attempt in 0..3u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let sent = client
            .post(url.clone())
            .timeout(Duration::from_secs(10))
            .header("Content-Type", "application/json")
            .header("X-Wasmbox-Execution-Id", &id)
            .header("X-Wasmbox-Timestamp", ts.to_string())
            .header("X-Wasmbox-Signature", sign(key, ts, &body))
            .body(body.clone())
            .send()
            .await;
        let mut r = match sent {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => r,
            Err(e) => {
                if let Some(why) = refusal(&e) {
                    tracing::warn!(execution = %id, "webhook {url} refused: {why}; the result was not delivered");
                    return;
                }
                tracing::warn!(execution = %id, "webhook {url}: {e}");
                continue;
            }
        };
        let status = r.status();
        if status.is_redirection() {
            let to = r.headers().get(reqwest::header::LOCATION);
            let to = to.map_or("nowhere".into(), |v| String::from_utf8_lossy(v.as_bytes()));
            tracing::warn!(execution = %id, "webhook {url} answered with a redirect ({status}) to {to}; redirects are not followed, so the result was not delivered");
            return;
        }
        let reply = match crate::cloud::read_capped(&mut r, REPLY_CAP).await {
            Ok((b, _)) => String::from_utf8_lossy(&b).chars().take(200).collect(),
            Err(_) => String::new(),
        };
        if status.is_client_error() {
            tracing::warn!(execution = %id, "webhook {url} refused the result: {status} {reply}");
            return;
        }
        tracing::warn!(execution = %id, "webhook {url}: {status} {reply}");
    }
    tracing::warn!(execution = %id, "webhook {url}: giving up after 3 attempts");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let local = WebhookConfig {
            allow_any_host: false,
            allow_private: false,
            secret: None,
        };
        for ok in [
            "http://127.0.0.1:9/x",
            "http://localhost/a",
            "https://[::1]:8443/",
        ] {
            assert!(check_url(ok, &local).is_ok(), "{ok}");
        }
        for bad in [
            "ftp://127.0.0.1/",
            "http://example.com/",
            "file:///etc/passwd",
            "nope",
        ] {
            assert!(check_url(bad, &local).is_err(), "{bad}");
        }
        let any = WebhookConfig {
            allow_any_host: true,
            allow_private: false,
            secret: None,
        };
        assert!(check_url("https://example.com/hook", &any).is_ok());
        for ok in [
            "http://8.8.8.8/",
            "http://[2606:4700::1111]/",
            "http://[::ffff:8.8.8.8]/",
            "http://[2002:808:808::1]/",
            "http://127.0.0.1:9/x",
            "http://[::ffff:127.0.0.1]/",
            "http://172.32.0.1/",
            "http://100.128.0.1/",
        ] {
            assert!(check_url(ok, &any).is_ok(), "{ok}");
        }
        let private = [
            "http://0.0.0.0/",
            "http://0.1.2.3/",
            "http://10.1.2.3/",
            "http://172.31.255.255/",
            "http://192.168.0.1/",
            "http://100.64.0.1/",
            "http://100.100.100.200/",
            "http://169.254.169.254/",
            "http://192.0.0.192/",
            "http://224.0.0.251/",
            "http://255.255.255.255/",
            "http://0x0a000001/",
            "http://[::]/",
            "http://[fd00:ec2::254]/",
            "http://[fe80::1]/",
            "http://[fec0::1]/",
            "http://[ff02::1]/",
            "http://[::ffff:192.168.1.1]/",
            "http://[::10.0.0.1]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[2002:a00:1::1]/",
        ];
        for bad in private {
            let e = check_url(bad, &any).unwrap_err().to_string();
            assert!(e.contains("WASMBOX_WEBHOOK_ALLOW_PRIVATE"), "{bad}: {e}");
        }
        let both = WebhookConfig {
            allow_private: true,
            ..any
        };
        for ok in private {
            assert!(check_url(ok, &both).is_ok(), "{ok}");
        }
        // ALLOW_PRIVATE alone opens nothing.
        let e = check_url(
            "http://10.1.2.3/",
            &WebhookConfig {
                allow_any_host: false,
                ..both
            },
        );
        assert!(e.unwrap_err().to_string().contains("only loopback"));
    }

    /// Names are checked by the addresses they resolve to, at delivery, and refused before any
    /// connection. The lookup is a table here: nothing is resolved or sent for real, and the
    /// one address that is connected to when allowed, 0.0.0.0, is the local host on Linux; it
    /// goes first, so without the check the test fails there (a delivery arrives) and never
    /// tries the others.
    #[tokio::test]
    async fn names_are_checked_by_the_addresses_they_resolve_to() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                h.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = sock.read(&mut buf).await;
                    let _ = sock
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let table: std::collections::HashMap<&'static str, Vec<IpAddr>> = [
            ("unspecified.test", vec![ip("0.0.0.0")]),
            ("metadata.test", vec![ip("169.254.169.254")]),
            ("rebind.test", vec![ip("127.0.0.1"), ip("10.0.0.7")]),
            ("ula.test", vec![ip("fd00::1")]),
            ("mapped.test", vec![ip("::ffff:192.168.1.1")]),
            ("loop.test", vec![ip("127.0.0.1")]),
        ]
        .into_iter()
        .collect();
        let lookup: Lookup = Arc::new(move |host: String| {
            let found = table.get(host.as_str()).cloned();
            Box::pin(async move { found.ok_or_else(|| std::io::Error::other("unknown name")) })
        });
        let any = WebhookConfig {
            allow_any_host: true,
            allow_private: false,
            secret: None,
        };
        let client = client_with(&any, lookup.clone()).unwrap();
        let post = |c: &reqwest::Client, host: &str| {
            c.post(format!("http://{host}:{port}/hook"))
                .body("{}")
                .send()
        };
        for host in [
            "unspecified.test",
            "metadata.test",
            "rebind.test",
            "ula.test",
            "mapped.test",
        ] {
            let e = post(&client, host).await.unwrap_err();
            let why = refusal(&e).unwrap_or_else(|| panic!("{host}: not refused: {e}"));
            assert!(
                why.0.contains("WASMBOX_WEBHOOK_ALLOW_PRIVATE"),
                "{host}: {why}"
            );
        }
        assert_eq!(
            hits.load(Ordering::SeqCst),
            0,
            "a refused name was connected to"
        );

        // deliver gives up at once on a refusal (a retry would wait a second first).
        let t = std::time::Instant::now();
        let url = Url::parse(&format!("http://metadata.test:{port}/hook")).unwrap();
        deliver(&client, url, b"k", serde_json::json!({})).await;
        assert!(
            t.elapsed() < Duration::from_millis(900),
            "{:?}",
            t.elapsed()
        );

        // Allowed: a name for loopback; the unspecified one with both switches; and by default
        // (loopback hosts only) a name must resolve to loopback alone.
        assert!(
            post(&client, "loop.test")
                .await
                .unwrap()
                .status()
                .is_success()
        );
        let both = WebhookConfig {
            allow_private: true,
            ..any.clone()
        };
        let c = client_with(&both, lookup.clone()).unwrap();
        assert!(
            post(&c, "unspecified.test")
                .await
                .unwrap()
                .status()
                .is_success()
        );
        let local = WebhookConfig {
            allow_any_host: false,
            ..both
        };
        let c = client_with(&local, lookup).unwrap();
        assert!(post(&c, "loop.test").await.unwrap().status().is_success());
        let e = post(&c, "rebind.test").await.unwrap_err();
        assert!(
            refusal(&e).is_some_and(|w| w.0.contains("only loopback")),
            "{e}"
        );
        assert_eq!(hits.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn signature_is_hmac_of_timestamp_and_body() {
        // Computed independently: python3 -c "import hmac,hashlib;
        // print(hmac.new(b'key', b'1.{}', hashlib.sha256).hexdigest())"
        let s = sign(b"key", 1, b"{}");
        assert_eq!(
            s,
            "sha256=1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224"
        );
        assert_ne!(s, sign(b"key", 2, b"{}"));
        assert_ne!(s, sign(b"other", 1, b"{}"));
    }
}
