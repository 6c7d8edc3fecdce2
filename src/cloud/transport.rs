//! How a HOPX request is sent, for both planes: credentials as sensitive headers, a timeout on
//! every call, retries only where sending again is safe, no redirects, bodies read up to a cap,
//! and a status turned into a [`CloudError`] with the key and token scrubbed out.
//!
//! Unlike the official SDK, only idempotent calls are retried: a retried `/execute`,
//! `/commands/run` or sandbox creation after a 5xx or a timeout can run code twice or leave a
//! second sandbox behind.

use std::time::{Duration, Instant};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, LOCATION, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::agent::Agent;
use super::config::{AGENT_REPLY_CAP, CONTROL_REPLY_CAP};
use super::control::Cloud;
use super::error::CloudError;
use super::route::CloudReason;

/// Whether a call may be sent again after a 429, 5xx or timeout.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    Idempotent,
    /// Runs user code: a second attempt could run it twice.
    RunsCode,
    /// Creates a sandbox: a second attempt could leave one behind.
    Creates,
    /// Not idempotent for another reason (a write, a background start).
    Once,
}

/// Which plane a call goes to, and so which credential it carries.
pub(super) enum Auth<'a> {
    /// The control plane: `X-API-Key`.
    Key,
    /// A sandbox's agent: its Bearer token, refreshed when it is about to expire or refused.
    Token(&'a Agent),
}

pub(super) struct Call<'a> {
    pub op: &'static str,
    /// What a 404 is about ("sandbox X", "file /p").
    pub target: String,
    pub method: Method,
    pub url: String,
    pub query: Vec<(&'static str, String)>,
    pub body: Option<Value>,
    pub timeout: Duration,
    pub auth: Auth<'a>,
    pub retry: Retry,
}

/// A successful reply, read whole (within its plane's cap).
pub(super) struct Reply {
    /// The call's operation, for the errors reading the body can give.
    pub op: &'static str,
    pub status: StatusCode,
    pub body: bytes::Bytes,
}

impl Reply {
    /// The body as `T`; an empty body (204) is `T::default()`.
    pub fn json<T: DeserializeOwned + Default>(&self) -> Result<T, CloudError> {
        if self.is_empty() {
            return Ok(T::default());
        }
        serde_json::from_slice(&self.body).map_err(|e| CloudError::BadResponse {
            op: self.op,
            message: format!("{e} (status {})", self.status.as_u16()),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.body.iter().all(u8::is_ascii_whitespace)
    }
}

impl Cloud {
    /// Sends one call with its retry policy: idempotent calls are retried on 429/5xx/timeouts;
    /// an agent 401 refreshes the token and resends once (a 401 means nothing ran).
    pub(super) async fn call(&self, c: Call<'_>) -> Result<Reply, CloudError> {
        let cfg = &self.inner.cfg;
        let key = cfg.check_available(&CloudReason::Request { what: c.op })?;
        let path = c.url.split_once("://").map_or(c.url.as_str(), |(_, rest)| {
            rest.find('/').map_or("/", |i| &rest[i..])
        });
        let mut attempt = 1;
        let mut refreshed = false;
        if let Auth::Token(sb) = c.auth
            && sb.token_expiring()
        {
            // Refreshing is idempotent; a failure here leaves the 401 path to handle it.
            if let Err(e) = Box::pin(sb.refresh_token()).await {
                tracing::debug!(sandbox = %sb.id(), error = %e, "early token refresh failed");
            }
        }
        loop {
            let mut rb = self
                .inner
                .http
                .request(c.method.clone(), &c.url)
                .timeout(c.timeout)
                .header(CONTENT_TYPE, "application/json");
            if !c.query.is_empty() {
                rb = rb.query(&c.query);
            }
            if let Some(b) = &c.body {
                rb = rb.json(b);
            }
            match c.auth {
                Auth::Key => rb = rb.header("X-API-Key", sensitive(key.expose())?),
                Auth::Token(sb) => {
                    if let Some(t) = sb.token_value() {
                        rb =
                            rb.header(AUTHORIZATION, sensitive(&format!("Bearer {}", t.expose()))?);
                    }
                }
            }
            let can_retry = c.retry == Retry::Idempotent && attempt < cfg.max_attempts;
            let backoff = cfg
                .retry_delay
                .saturating_mul(1 << (attempt - 1))
                .min(cfg.max_retry_delay);
            let started = Instant::now();
            let sent = match rb.send().await {
                Ok(mut resp) => {
                    let status = resp.status();
                    let retry_after = resp
                        .headers()
                        .get(RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok());
                    if status.is_redirection() {
                        let ms = started.elapsed().as_millis() as u64;
                        tracing::debug!(op = c.op, method = %c.method, path, status = status.as_u16(), ms, attempt, "HOPX redirect refused");
                        let to: String =
                            resp.headers().get(LOCATION).map_or("nowhere".into(), |v| {
                                String::from_utf8_lossy(v.as_bytes())
                                    .chars()
                                    .take(200)
                                    .collect()
                            });
                        return Err(CloudError::Redirect {
                            op: c.op,
                            status: status.as_u16(),
                            location: self.scrub(&to, &c.auth),
                        });
                    }
                    let cap = match c.auth {
                        Auth::Key => CONTROL_REPLY_CAP,
                        Auth::Token(_) => AGENT_REPLY_CAP,
                    };
                    match read_capped(&mut resp, cap).await {
                        Ok((body, true)) => Ok((status, retry_after, body)),
                        Ok((_, false)) => {
                            let ms = started.elapsed().as_millis() as u64;
                            tracing::debug!(op = c.op, method = %c.method, path, status = status.as_u16(), ms, attempt, "HOPX reply over its cap");
                            return Err(CloudError::TooLarge {
                                op: c.op,
                                limit: cap,
                            });
                        }
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            let ms = started.elapsed().as_millis() as u64;
            let (status, header_retry_after, body) = match sent {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(op = c.op, method = %c.method, path, ms, attempt, error = %e, "HOPX request failed");
                    // A refused connection never reached the server, so even a code run may
                    // be sent again.
                    if can_retry || (e.is_connect() && attempt < cfg.max_attempts) {
                        tokio::time::sleep(backoff).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(if e.is_timeout() {
                        CloudError::Timeout {
                            op: c.op,
                            after: c.timeout,
                            note: note(c.retry, attempt),
                        }
                    } else {
                        CloudError::Network {
                            op: c.op,
                            message: self.scrub(&error_chain(&e), &c.auth),
                        }
                    });
                }
            };
            tracing::debug!(op = c.op, method = %c.method, path, status = status.as_u16(), ms, attempt, "HOPX request");
            if status.is_success() {
                return Ok(Reply {
                    op: c.op,
                    status,
                    body,
                });
            }
            if status == StatusCode::UNAUTHORIZED {
                match c.auth {
                    Auth::Key => return Err(CloudError::BadApiKey),
                    Auth::Token(_) if refreshed => return Err(CloudError::BadToken { op: c.op }),
                    Auth::Token(sb) => {
                        refreshed = true;
                        Box::pin(sb.refresh_token()).await?;
                        continue;
                    }
                }
            }
            let info = ErrorInfo::parse(&body, status, |s| self.scrub(s, &c.auth));
            let transient = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
            if transient && can_retry {
                let delay = if status == StatusCode::TOO_MANY_REQUESTS {
                    info.retry_after
                        .or(header_retry_after)
                        .map_or(backoff, Duration::from_secs)
                        .min(cfg.max_retry_delay)
                } else {
                    backoff
                };
                tokio::time::sleep(delay).await;
                attempt += 1;
                continue;
            }
            return Err(map_status(&c, status, info, header_retry_after, attempt));
        }
    }

    /// Server text can echo request data; the key and the sandbox token never leave as text.
    fn scrub(&self, s: &str, auth: &Auth<'_>) -> String {
        let mut out = s.to_string();
        if let Some(k) = &self.inner.cfg.api_key
            && !k.expose().is_empty()
        {
            out = out.replace(k.expose(), "***");
        }
        if let Auth::Token(sb) = auth
            && let Some(t) = sb.token_value()
            && !t.expose().is_empty()
        {
            out = out.replace(t.expose(), "***");
        }
        out
    }
}

/// Reads a reply's body, at most `cap` bytes: with `true` the whole body, with `false` the body
/// is longer (its `Content-Length` says so, or reading found out) and the rest was never read.
/// Replies come from servers we do not control; `bytes()` would buffer whatever they send.
pub(crate) async fn read_capped(
    resp: &mut reqwest::Response,
    cap: usize,
) -> reqwest::Result<(bytes::Bytes, bool)> {
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Ok((bytes::Bytes::new(), false));
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body.freeze(), false));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body.freeze(), true))
}

fn sensitive(v: &str) -> Result<HeaderValue, CloudError> {
    let mut h = HeaderValue::from_str(v).map_err(|_| {
        CloudError::Setup("the API key or token contains characters not allowed in a header".into())
    })?;
    h.set_sensitive(true);
    Ok(h)
}

fn note(retry: Retry, attempts: u32) -> &'static str {
    match retry {
        Retry::RunsCode => "; not retried, because running it again could run the code twice",
        Retry::Creates => "; not retried, because it could create a second sandbox",
        Retry::Idempotent if attempts > 1 => " (after retries)",
        _ => "",
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// The useful parts of an error body, in either plane's shape.
struct ErrorInfo {
    message: String,
    code: Option<String>,
    retry_after: Option<u64>,
}

impl ErrorInfo {
    fn parse(body: &[u8], status: StatusCode, scrub: impl Fn(&str) -> String) -> Self {
        let raw = String::from_utf8_lossy(body).trim().to_string();
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let (err, top) = (&v["error"], &v);
        let (message, code, details) = if err.is_object() {
            (
                err["message"].as_str(),
                err["code"].as_str(),
                &err["details"],
            )
        } else {
            (
                err.as_str().or(top["message"].as_str()),
                top["code"].as_str(),
                &top["details"],
            )
        };
        let message = match message {
            Some(m) if !m.trim().is_empty() => m.trim().to_string(),
            _ if !raw.is_empty() => raw,
            _ => status
                .canonical_reason()
                .unwrap_or("no details")
                .to_string(),
        };
        let mut message = scrub(&message);
        if let Some((i, _)) = message.char_indices().nth(300) {
            message.truncate(i);
            message.push_str("...");
        }
        ErrorInfo {
            message,
            code: code.map(String::from),
            retry_after: details["retry_after_seconds"].as_u64(),
        }
    }
}

fn map_status(
    c: &Call<'_>,
    status: StatusCode,
    info: ErrorInfo,
    header_retry_after: Option<u64>,
    attempts: u32,
) -> CloudError {
    let op = c.op;
    let s = status.as_u16();
    match (s, &info.code, &c.auth) {
        (429, ..) => CloudError::RateLimited {
            op,
            retry_after: info.retry_after.or(header_retry_after),
        },
        (500.., ..) => CloudError::Server {
            op,
            status: s,
            message: info.message,
            note: note(c.retry, attempts),
        },
        (_, Some(code), Auth::Token(_)) => CloudError::Agent {
            op,
            status: s,
            code: code.clone(),
            message: info.message,
        },
        (403, ..) if info.message.to_ascii_lowercase().contains("limit") => {
            CloudError::LimitReached {
                op,
                message: info.message,
            }
        }
        (403, ..) => CloudError::Forbidden {
            op,
            message: info.message,
        },
        (404, ..) => CloudError::NotFound {
            what: c.target.clone(),
            message: info.message,
        },
        _ => CloudError::Api {
            op,
            status: s,
            message: info.message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_of_both_planes_are_read() {
        let id = |s: &str| s.to_string();
        let e = ErrorInfo::parse(
            br#"{"error":{"message":"Slow down","code":"rate_limited","details":{"retry_after_seconds":7}}}"#,
            StatusCode::TOO_MANY_REQUESTS,
            id,
        );
        assert_eq!((e.message.as_str(), e.retry_after), ("Slow down", Some(7)));
        let e = ErrorInfo::parse(
            br#"{"error":"File not found","code":"FILE_NOT_FOUND"}"#,
            StatusCode::NOT_FOUND,
            id,
        );
        assert_eq!(
            (e.message.as_str(), e.code.as_deref()),
            ("File not found", Some("FILE_NOT_FOUND"))
        );
        let e = ErrorInfo::parse(b"<html>bad gateway</html>", StatusCode::BAD_GATEWAY, id);
        assert_eq!(e.message, "<html>bad gateway</html>");
        let e = ErrorInfo::parse(b"", StatusCode::BAD_GATEWAY, id);
        assert_eq!(e.message, "Bad Gateway");
    }
}
