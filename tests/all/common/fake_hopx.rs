//! A fake HOPX: the control plane and the in-sandbox agents of `hopx-api.md` on one real HTTP
//! server on 127.0.0.1. It records every request, checks the auth headers of each plane (a
//! breach is a recorded violation, see [`FakeHopx::assert_clean`]) and can be scripted to fail.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The account key the fake accepts. Tests assert it never shows up in text.
pub const API_KEY: &str = "hopx_test_K3Y_must_never_leak_8d1e";

#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// What a scripted rule does to a matching request.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer with this status and JSON body; `{key}` in the body is replaced by the X-API-Key
    /// the request carried (a server that echoes input).
    Status(u16, Value),
    /// Wait this long, then answer normally.
    Delay(Duration),
    /// Answer with this 3xx status and `Location` (a server, or a man in the middle, that
    /// bounces the client elsewhere).
    Redirect(u16, String),
    /// Answer 200 with a JSON object of about this many bytes (every field a reply may need, and
    /// a long `content`), streamed in chunks with no `Content-Length`.
    Huge(usize),
    /// The same with a `Content-Length` header.
    HugeSized(usize),
}

struct Rule {
    method: Method,
    path_suffix: String,
    times: usize,
    fault: Fault,
}

#[derive(Default)]
struct Sbx {
    token: String,
    files: BTreeMap<String, String>,
    dirs: Vec<String>,
    env: BTreeMap<String, String>,
    processes: Vec<Value>,
    deleted: bool,
    health_probes: u32,
}

struct St {
    addr: SocketAddr,
    requests: Vec<Recorded>,
    violations: Vec<String>,
    rules: Vec<Rule>,
    sandboxes: BTreeMap<String, Sbx>,
    seq: u32,
    /// Put `auth_token` in the create reply (else the client must call token/refresh).
    pub create_token: bool,
    /// Seconds from now to a new token's `token_expires_at` (negative: already expired).
    pub token_ttl: i64,
    /// Agent `/health` answers "starting" this many times per sandbox before "healthy".
    pub health_not_ready: u32,
}

/// Settings a test may change before it runs.
pub struct Knobs<'a>(std::sync::MutexGuard<'a, St>);

impl Knobs<'_> {
    pub fn create_token(&mut self, v: bool) {
        self.0.create_token = v;
    }
    pub fn token_ttl(&mut self, secs: i64) {
        self.0.token_ttl = secs;
    }
    pub fn health_not_ready(&mut self, n: u32) {
        self.0.health_not_ready = n;
    }
}

#[derive(Clone)]
pub struct FakeHopx {
    pub addr: SocketAddr,
    st: Arc<Mutex<St>>,
}

impl FakeHopx {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let st = Arc::new(Mutex::new(St {
            addr,
            requests: vec![],
            violations: vec![],
            rules: vec![],
            sandboxes: BTreeMap::new(),
            seq: 0,
            create_token: true,
            token_ttl: 3600,
            health_not_ready: 0,
        }));
        let app = axum::Router::new().fallback(handle).with_state(st.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeHopx { addr, st }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn knobs(&self) -> Knobs<'_> {
        Knobs(self.st.lock().unwrap())
    }

    /// The next `times` requests whose method matches and whose path ends with `path_suffix`
    /// get `fault`.
    pub fn fail(&self, method: Method, path_suffix: &str, times: usize, fault: Fault) {
        self.st.lock().unwrap().rules.push(Rule {
            method,
            path_suffix: path_suffix.into(),
            times,
            fault,
        });
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.st.lock().unwrap().requests.clone()
    }

    /// "METHOD /path" of every request, in order, with agent paths shortened to `/agent/...`.
    pub fn calls(&self) -> Vec<String> {
        self.requests()
            .iter()
            .map(|r| {
                let path = match r.path.strip_prefix("/agent/") {
                    Some(rest) => {
                        format!("/agent{}", &rest[rest.find('/').unwrap_or(rest.len())..])
                    }
                    None => r.path.clone(),
                };
                format!("{} {path}", r.method)
            })
            .collect()
    }

    pub fn count(&self, method: &str, path_suffix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == method && r.path.ends_with(path_suffix))
            .count()
    }

    /// Sandboxes created and not deleted.
    pub fn live_sandboxes(&self) -> Vec<String> {
        let st = self.st.lock().unwrap();
        st.sandboxes
            .iter()
            .filter(|(_, s)| !s.deleted)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Rotates a sandbox's token on the server side, so the client's copy is stale.
    pub fn revoke_token(&self, id: &str) {
        let mut st = self.st.lock().unwrap();
        let sb = st.sandboxes.get_mut(id).unwrap();
        sb.token = format!("{}-revoked", sb.token);
    }

    pub fn file(&self, id: &str, path: &str) -> Option<String> {
        self.st.lock().unwrap().sandboxes[id]
            .files
            .get(path)
            .cloned()
    }

    /// Panics with the list of protocol breaches (wrong or missing auth headers, bad bodies).
    pub fn assert_clean(&self) {
        let v = self.st.lock().unwrap().violations.clone();
        assert!(
            v.is_empty(),
            "the fake HOPX saw protocol violations:\n{}",
            v.join("\n")
        );
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// `YYYY-MM-DDTHH:MM:SSZ` for Unix seconds (civil from days, H. Hinnant).
fn iso(ts: i64) -> String {
    let (days, secs) = (ts.div_euclid(86_400), ts.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn reply(status: u16, body: Value) -> Response {
    (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response()
}

fn agent_error(status: u16, msg: &str, code: &str) -> Response {
    reply(
        status,
        json!({"error": msg, "code": code, "request_id": "req-fake", "timestamp": iso(now())}),
    )
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| {
            // Enough URL decoding for paths.
            let mut out = Vec::new();
            let b = v.as_bytes();
            let mut i = 0;
            while i < b.len() {
                match b[i] {
                    b'%' if i + 2 < b.len() => {
                        let h = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                        out.push(u8::from_str_radix(h, 16).unwrap());
                        i += 3;
                    }
                    b'+' => {
                        out.push(b' ');
                        i += 1;
                    }
                    c => {
                        out.push(c);
                        i += 1;
                    }
                }
            }
            String::from_utf8(out).unwrap()
        })
    })
}

async fn handle(
    State(st): State<Arc<Mutex<St>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let rec = Recorded {
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().unwrap_or("").to_string(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("<binary>").to_string()))
            .collect(),
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    let fault = {
        let mut s = st.lock().unwrap();
        s.requests.push(rec.clone());
        s.rules
            .iter_mut()
            .find(|r| r.times > 0 && r.method == method && rec.path.ends_with(&r.path_suffix))
            .map(|r| {
                r.times -= 1;
                r.fault.clone()
            })
    };
    match fault {
        Some(Fault::Status(code, body)) => {
            let key = rec.header("x-api-key").unwrap_or("");
            let text = body.to_string().replace("{key}", key);
            return (
                StatusCode::from_u16(code).unwrap(),
                [("content-type", "application/json")],
                text,
            )
                .into_response();
        }
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        Some(Fault::Redirect(code, location)) => {
            return (
                StatusCode::from_u16(code).unwrap(),
                [("location", location)],
            )
                .into_response();
        }
        Some(Fault::Huge(n)) => return huge(n, false),
        Some(Fault::HugeSized(n)) => return huge(n, true),
        None => {}
    }
    let mut s = st.lock().unwrap();
    if let Some(rest) = rec.path.strip_prefix("/agent/") {
        let (id, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        agent(&mut s, &rec, id, path)
    } else {
        control(&mut s, &rec)
    }
}

/// A valid JSON reply of about `n` bytes, built from one shared 64 KiB chunk.
fn huge(n: usize, sized: bool) -> Response {
    const CHUNK: usize = 64 << 10;
    let head = r#"{"id":"huge","status":"running","data":[],"processes":[],"content":""#;
    let chunks = n.saturating_sub(head.len() + 2).div_ceil(CHUNK);
    let pad = Bytes::from(vec![b'a'; CHUNK]);
    let parts: Vec<Bytes> = std::iter::once(Bytes::from_static(head.as_bytes()))
        .chain(std::iter::repeat_n(pad, chunks))
        .chain(std::iter::once(Bytes::from_static(b"\"}")))
        .collect();
    let len: usize = parts.iter().map(Bytes::len).sum();
    let body = axum::body::Body::from_stream(futures::stream::iter(
        parts.into_iter().map(Ok::<_, std::convert::Infallible>),
    ));
    let mut r = (StatusCode::OK, [("content-type", "application/json")], body).into_response();
    if sized {
        r.headers_mut()
            .insert("content-length", len.to_string().parse().unwrap());
    }
    r
}

fn control(s: &mut St, rec: &Recorded) -> Response {
    if rec.header("authorization").is_some() {
        s.violations.push(format!(
            "{} {}: Authorization sent to the control plane",
            rec.method, rec.path
        ));
    }
    match rec.header("x-api-key") {
        None => {
            s.violations
                .push(format!("{} {}: no X-API-Key", rec.method, rec.path));
            return reply(
                401,
                json!({"error": {"message": "API key required", "code": "unauthorized"}}),
            );
        }
        Some(k) if k != API_KEY => {
            return reply(
                401,
                json!({"error": {"message": format!("Invalid API key {k}"), "code": "unauthorized"}}),
            );
        }
        Some(_) => {}
    }
    let parts: Vec<&str> = rec.path.trim_start_matches('/').split('/').collect();
    let addr = s.addr;
    let sandbox_json = |id: &str, sb: &Sbx| {
        json!({"id": id, "status": if sb.deleted { "stopped" } else { "running" },
               "public_host": format!("http://{addr}/agent/{id}/"), "direct_url": null,
               "template_id": "291", "template_name": "code-interpreter", "organization_id": 1,
               "region": "eu-1001", "timeout_seconds": 600, "created_at": iso(now())})
    };
    let not_found = || {
        reply(
            404,
            json!({"error": {"message": "Sandbox not found", "code": "not_found"}}),
        )
    };
    match (rec.method.as_str(), parts.as_slice()) {
        ("POST", ["v1", "sandboxes"]) => {
            let b = rec.json();
            let by_name = b["template_name"].is_string();
            let by_id = b["template_id"]
                .as_str()
                .is_some_and(|t| t.bytes().all(|c| c.is_ascii_digit()));
            if by_name == by_id {
                s.violations.push(format!(
                    "create: need exactly one of template_name / template_id: {b}"
                ));
                return reply(
                    400,
                    json!({"error": {"message": "bad template", "code": "invalid"}}),
                );
            }
            s.seq += 1;
            let id = format!("{}fake{:04}", now(), s.seq);
            let token = format!("jwt-{id}-1");
            let mut out = json!({"id": id, "status": "running"});
            if s.create_token {
                out["auth_token"] = token.clone().into();
                out["token_expires_at"] = iso(now() + s.token_ttl).into();
            }
            s.sandboxes.insert(
                id,
                Sbx {
                    token,
                    ..Default::default()
                },
            );
            reply(201, out)
        }
        ("GET", ["v1", "sandboxes"]) => {
            let data: Vec<Value> = s
                .sandboxes
                .iter()
                .filter(|(_, sb)| !sb.deleted)
                .map(|(id, sb)| sandbox_json(id, sb))
                .collect();
            reply(
                200,
                json!({"data": data, "has_more": false, "next_cursor": null}),
            )
        }
        ("GET", ["v1", "sandboxes", id]) => match s.sandboxes.get(*id) {
            Some(sb) => reply(200, sandbox_json(id, sb)),
            None => not_found(),
        },
        ("DELETE", ["v1", "sandboxes", id]) => match s.sandboxes.get_mut(*id) {
            Some(sb) if !sb.deleted => {
                sb.deleted = true;
                StatusCode::NO_CONTENT.into_response()
            }
            _ => not_found(),
        },
        ("POST", ["v1", "sandboxes", id, "token", "refresh"]) => {
            let ttl = s.token_ttl;
            match s.sandboxes.get_mut(*id) {
                Some(sb) if !sb.deleted => {
                    let n: u32 = sb
                        .token
                        .rsplit('-')
                        .next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(1);
                    sb.token = format!("jwt-{id}-{}", n + 1);
                    reply(
                        200,
                        json!({"auth_token": sb.token, "token_expires_at": iso(now() + ttl)}),
                    )
                }
                _ => not_found(),
            }
        }
        _ => {
            s.violations
                .push(format!("unknown control call {} {}", rec.method, rec.path));
            reply(
                404,
                json!({"error": {"message": "no such route", "code": "not_found"}}),
            )
        }
    }
}

fn agent(s: &mut St, rec: &Recorded, id: &str, path: &str) -> Response {
    if rec.header("x-api-key").is_some() {
        s.violations.push(format!(
            "{} {path}: X-API-Key sent to the agent",
            rec.method
        ));
    }
    let health_not_ready = s.health_not_ready;
    let token = match s.sandboxes.get(id) {
        None => return agent_error(502, "no such VM", "INTERNAL_ERROR"),
        Some(sb) if sb.deleted => return agent_error(502, "VM is gone", "INTERNAL_ERROR"),
        Some(sb) => sb.token.clone(),
    };
    match rec.header("authorization") {
        Some(a) if a == format!("Bearer {token}") => {}
        Some(_) => return agent_error(401, "invalid or expired token", "UNAUTHORIZED"),
        None => {
            let v = format!("{} {path}: no Authorization", rec.method);
            s.violations.push(v);
            return agent_error(401, "missing token", "UNAUTHORIZED");
        }
    }
    let mut violations = Vec::new();
    let sb = s.sandboxes.get_mut(id).unwrap();
    let resp = agent_op(sb, rec, path, health_not_ready, &mut violations);
    s.violations.extend(violations);
    resp
}

fn agent_op(
    sb: &mut Sbx,
    rec: &Recorded,
    path: &str,
    health_not_ready: u32,
    violations: &mut Vec<String>,
) -> Response {
    let b = rec.json();
    let run = |sb: &Sbx, language: &str, code: &str, env: &Value| {
        let mut vars = sb.env.clone();
        if let Some(e) = env.as_object() {
            for (k, v) in e {
                vars.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
            }
        }
        let exit: i32 = code
            .split("exit ")
            .nth(1)
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        let env_lines: String = vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        json!({"stdout": format!("[{language}] {code}\n{env_lines}"), "stderr": "",
               "exit_code": exit, "execution_time": 0.012, "success": exit == 0,
               "timestamp": iso(now()), "language": language})
    };
    let path_q = query_param(&rec.query, "path");
    match (rec.method.as_str(), path) {
        ("GET", "/health") => {
            sb.health_probes += 1;
            let status = if sb.health_probes > health_not_ready {
                "healthy"
            } else {
                "starting"
            };
            reply(
                200,
                json!({"status": status, "agent": "fake", "version": "3.1.1"}),
            )
        }
        ("POST", "/execute") => {
            let ok = b["language"].is_string()
                && b["code"].is_string()
                && b["timeout"].as_u64().is_some_and(|t| t >= 1)
                && b.as_object().is_some_and(|o| o.contains_key("workdir"));
            if !ok {
                violations.push(format!("bad /execute body: {b}"));
                return agent_error(400, "bad body", "INVALID_REQUEST");
            }
            reply(
                200,
                run(
                    sb,
                    b["language"].as_str().unwrap(),
                    b["code"].as_str().unwrap(),
                    &b["env"],
                ),
            )
        }
        ("POST", "/commands/run") | ("POST", "/commands/background") => {
            let ok = b["command"] == "bash"
                && b["args"][0] == "-c"
                && b["args"][1].is_string()
                && b["timeout"].as_u64().is_some_and(|t| t >= 1);
            if !ok {
                violations.push(format!("bad {path} body: {b}"));
                return agent_error(400, "bad body", "INVALID_REQUEST");
            }
            if path == "/commands/background" {
                let pid = format!("cmd_{}", sb.processes.len() + 1);
                sb.processes
                    .push(json!({"process_id": pid, "status": "running", "language": "bash"}));
                return reply(200, json!({"process_id": pid, "status": "running"}));
            }
            reply(
                200,
                run(sb, "bash", b["args"][1].as_str().unwrap(), &b["env"]),
            )
        }
        ("POST", "/execute/background") => {
            if b.get("workdir").is_some() {
                violations.push("workdir sent to /execute/background".into());
            }
            let pid = format!("proc_{}", sb.processes.len() + 1);
            sb.processes
                .push(json!({"process_id": pid, "status": "running", "name": b["name"]}));
            reply(
                200,
                json!({"process_id": pid, "execution_id": pid, "status": "running"}),
            )
        }
        ("GET", "/execute/processes") => reply(
            200,
            json!({"processes": sb.processes, "count": sb.processes.len()}),
        ),
        ("POST", p) if p.starts_with("/execute/kill/") => {
            let pid = &p["/execute/kill/".len()..];
            match sb.processes.iter_mut().find(|p| p["process_id"] == pid) {
                Some(p) => {
                    p["status"] = "killed".into();
                    reply(200, json!({"status": "killed", "process_id": pid}))
                }
                None => agent_error(404, "Process not found", "PROCESS_NOT_FOUND"),
            }
        }
        ("GET", "/files/read") => match path_q.and_then(|p| sb.files.get(&p).cloned()) {
            Some(c) => reply(200, json!({"content": c, "size": c.len()})),
            None => agent_error(404, "File not found", "FILE_NOT_FOUND"),
        },
        ("POST", "/files/write") => {
            let (Some(p), Some(c)) = (b["path"].as_str(), b["content"].as_str()) else {
                violations.push(format!("bad /files/write body: {b}"));
                return agent_error(400, "bad body", "INVALID_REQUEST");
            };
            if !p.starts_with("/workspace/") && !p.starts_with("/tmp/") {
                return agent_error(403, &format!("path {p} is not allowed"), "PATH_NOT_ALLOWED");
            }
            sb.files.insert(p.into(), c.into());
            reply(200, json!({"success": true, "path": p, "size": c.len()}))
        }
        ("GET", "/files/list") => {
            let dir = path_q.unwrap_or_else(|| "/workspace".into());
            let prefix = format!("{}/", dir.trim_end_matches('/'));
            let files: Vec<Value> = sb
                .files
                .iter()
                .filter(|(p, _)| p.starts_with(&prefix) && !p[prefix.len()..].contains('/'))
                .map(|(p, c)| json!({"name": &p[prefix.len()..], "path": p, "size": c.len(), "is_dir": false, "mode": "0644"}))
                .chain(sb.dirs.iter().filter(|d| d.starts_with(&prefix)).map(|d| {
                    json!({"name": &d[prefix.len()..], "path": d, "size": 0, "is_directory": true})
                }))
                .collect();
            reply(
                200,
                json!({"files": files, "path": dir, "count": files.len()}),
            )
        }
        ("GET", "/files/exists") => {
            let p = path_q.unwrap_or_default();
            reply(
                200,
                json!({"exists": sb.files.contains_key(&p) || sb.dirs.contains(&p)}),
            )
        }
        ("DELETE", "/files/remove") => match path_q.and_then(|p| sb.files.remove(&p)) {
            Some(_) => StatusCode::NO_CONTENT.into_response(),
            None => agent_error(404, "File not found", "FILE_NOT_FOUND"),
        },
        ("POST", "/files/mkdir") => {
            sb.dirs.push(b["path"].as_str().unwrap_or_default().into());
            reply(200, json!({"success": true}))
        }
        ("GET", "/env") => reply(
            200,
            json!({"env_vars": masked(&sb.env), "count": sb.env.len()}),
        ),
        ("PATCH", "/env") => {
            if b["merge"] != true {
                violations.push(format!("PATCH /env without merge: {b}"));
            }
            for (k, v) in b["env_vars"].as_object().cloned().unwrap_or_default() {
                sb.env.insert(k, v.as_str().unwrap_or_default().into());
            }
            StatusCode::NO_CONTENT.into_response()
        }
        ("PUT", "/env") => {
            sb.env = b["env_vars"]
                .as_object()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.as_str().unwrap_or_default().into()))
                .collect();
            reply(200, json!({"env_vars": masked(&sb.env)}))
        }
        _ => {
            violations.push(format!("unknown agent call {} {path}", rec.method));
            agent_error(404, "no such endpoint", "INVALID_REQUEST")
        }
    }
}

/// The agent masks values whose names look secret.
fn masked(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    env.iter()
        .map(|(k, v)| {
            let secret = ["KEY", "SECRET", "TOKEN", "PASSWORD"]
                .iter()
                .any(|w| k.to_uppercase().contains(w));
            (
                k.clone(),
                if secret {
                    "***MASKED***".into()
                } else {
                    v.clone()
                },
            )
        })
        .collect()
}
