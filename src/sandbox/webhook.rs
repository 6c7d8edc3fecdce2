//! Async executions report to a webhook: the result is POSTed as JSON, signed with HMAC-SHA256
//! over `<timestamp>.<body>` (headers `X-Wasmbox-Timestamp`, `X-Wasmbox-Signature:
//! sha256=<hex>`), so a receiver can check it came from this server and is fresh.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use reqwest::Url;
use sha2::Sha256;

use crate::config::WebhookConfig;
use crate::error::{Error, Result};

/// Checks a callback URL: http(s), and a loopback host unless any host is allowed.
pub fn check_url(url: &str, cfg: &WebhookConfig) -> Result<Url> {
    let bad = |why: &str| Error::Webhook(format!("Invalid callback_url {url:?}: {why}"));
    let parsed = Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("only http and https URLs are allowed"));
    }
    let loopback = match parsed.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => return Err(bad("it has no host")),
    };
    if !loopback && !cfg.allow_any_host {
        return Err(bad(
            "only loopback hosts (localhost, 127.0.0.0/8, ::1) are allowed; set WASMBOX_WEBHOOK_ALLOW_ANY=1 to allow others",
        ));
    }
    Ok(parsed)
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
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
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
/// us: the execution is not re-run).
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
        match sent {
            Ok(r) if r.status().is_success() => return,
            Ok(r) if r.status().is_client_error() => {
                tracing::warn!(execution = %id, "webhook {url} refused the result: {}", r.status());
                return;
            }
            Ok(r) => tracing::warn!(execution = %id, "webhook {url}: {}", r.status()),
            Err(e) => tracing::warn!(execution = %id, "webhook {url}: {e}"),
        }
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
            secret: None,
        };
        assert!(check_url("https://example.com/hook", &any).is_ok());
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
