//! Guest HTTP through the host (#33): a real axum server on 127.0.0.1, the real binary over
//! stdio, Python's urllib/http.client/pandas and JavaScript's fetch as a user writes them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::common::*;

/// The server the guests reach: data, an echo, redirects, a large body and a slow answer.
async fn site() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let port = addr.port();
    let app = axum::Router::new()
        .route(
            "/data.csv",
            get(|| async { ([(header::CONTENT_TYPE, "text/csv")], "a,b\n1,2\n3,4\n") }),
        )
        .route(
            "/echo",
            post(|headers: HeaderMap, body: Bytes| async move {
                axum::Json(json!({
                    "body": String::from_utf8_lossy(&body),
                    "token": headers.get("x-token").and_then(|v| v.to_str().ok()),
                    "type": headers.get("content-type").and_then(|v| v.to_str().ok()),
                }))
            }),
        )
        .route(
            "/hop",
            get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/data.csv")]) }),
        )
        .route(
            "/away",
            get(move || async move {
                let to = format!("http://localhost:{port}/data.csv");
                (StatusCode::FOUND, [(header::LOCATION, to)]).into_response()
            }),
        )
        .route("/big", get(|| async { "x".repeat(5000) }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "late"
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn run(c: &Client, language: &str, code: &str, extra: Value) -> Value {
    let mut args = json!({"code": code, "language": language});
    args.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let r = call(c, "execute_code", args).await;
    assert!(!is_error(&r), "tool error: {:?}", r.content);
    object(&r)
}

fn allowing(addr: SocketAddr) -> Vec<(String, String)> {
    vec![
        (
            "WASMBOX_ALLOW_HOSTS".into(),
            format!("127.0.0.1:{}", addr.port()),
        ),
        ("WASMBOX_ALLOW_PRIVATE_HOSTS".into(), "1".into()),
        ("WASMBOX_HTTP_BYTES".into(), "1000".into()),
    ]
}

async fn server_for(env: &[(String, String)]) -> Client {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    server_with_env(&env).await
}

#[tokio::test]
async fn python_and_javascript_reach_an_allowed_host() {
    let addr = site().await;
    let c = server_for(&allowing(addr)).await;
    let base = format!("http://{addr}");
    let r = run(
        &c,
        "python",
        &format!(
            r#"
import urllib.request, json, http.client, pandas as pd
print(pd.read_csv("{base}/data.csv")["b"].sum())
req = urllib.request.Request("{base}/echo", data=b"hi", headers={{"X-Token": "t1"}})
print(json.loads(urllib.request.urlopen(req).read()))
print(urllib.request.urlopen("{base}/hop").read().decode().splitlines()[1])
c = http.client.HTTPConnection("127.0.0.1", {port})
c.request("GET", "/missing")
r = c.getresponse()
print(r.status, r.reason, r.read())
"#,
            port = addr.port()
        ),
        json!({}),
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(
        r["stdout"],
        "6\n{'body': 'hi', 'token': 't1', 'type': 'application/x-www-form-urlencoded'}\n1,2\n404 Not Found b''\n",
        "{r}"
    );
    let r = run(
        &c,
        "javascript",
        &format!(
            r#"
const r = await fetch("{base}/data.csv");
console.log(r.status, r.ok, r.headers.get("content-type"), (await r.text()).length);
const e = await fetch("{base}/echo", {{method: "POST", body: JSON.stringify({{a: 1}}), headers: {{"x-token": "t2", "content-type": "application/json"}}}});
console.log(JSON.stringify(await e.json()));
const h = await fetch("{base}/hop");
console.log(h.status, h.redirected);
"#
        ),
        json!({}),
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(
        r["stdout"],
        "200 true text/csv 12\n{\"body\":\"{\\\"a\\\":1}\",\"token\":\"t2\",\"type\":\"application/json\"}\n200 true\n",
        "{r}"
    );
    // Go: net/http's default client, once the snippet imports wasmbox/http.
    let r = run(
        &c,
        "go",
        &format!(
            r#"package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	_ "wasmbox/http"
)

func main() {{
	r, err := http.Get("{base}/data.csv")
	if err != nil {{
		fmt.Println("error", err)
		return
	}}
	b, _ := io.ReadAll(r.Body)
	fmt.Println(r.StatusCode, r.Header.Get("Content-Type"), len(b))
	p, _ := http.Post("{base}/echo", "text/plain", strings.NewReader("from go"))
	b, _ = io.ReadAll(p.Body)
	fmt.Println(string(b))
	_, err = http.Get("https://example.com/")
	fmt.Println(err)
}}
"#
        ),
        json!({"timeout": 120}),
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(
        r["stdout"],
        format!(
            "200 text/csv 12\n{{\"body\":\"from go\",\"token\":null,\"type\":\"text/plain\"}}\nGet \"https://example.com/\": wasmbox: example.com:443 is not an allowed host: WASMBOX_ALLOW_HOSTS=127.0.0.1:{} does not include it\n",
            addr.port()
        ),
        "{r}"
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn refusals_name_the_host_and_the_setting() {
    let addr = site().await;
    let port = addr.port();
    let base = format!("http://{addr}");
    let c = server_for(&allowing(addr)).await;
    let code = |url: &str| {
        format!(
            r#"
import urllib.request
try:
    urllib.request.urlopen("{url}")
except OSError as e:
    print(type(e).__name__, e)
"#
        )
    };
    // A host off the list, over https too.
    let r = run(&c, "python", &code("https://example.com/"), json!({})).await;
    assert_eq!(
        r["stdout"],
        format!(
            "ConnectionRefusedError example.com:443 is not an allowed host: WASMBOX_ALLOW_HOSTS=127.0.0.1:{port} does not include it\n"
        ),
        "{r}"
    );
    // A redirect to a host off the list is not followed.
    let r = run(&c, "python", &code(&format!("{base}/away")), json!({})).await;
    let out = r["stdout"].as_str().unwrap();
    assert!(
        out.starts_with("ConnectionRefusedError ")
            && out.contains(&format!(
                "redirects to http://localhost:{port}/data.csv, which is refused"
            )),
        "{r}"
    );
    // A body over WASMBOX_HTTP_BYTES.
    let r = run(&c, "python", &code(&format!("{base}/big")), json!({})).await;
    assert!(
        r["stdout"]
            .as_str()
            .unwrap()
            .contains("over WASMBOX_HTTP_BYTES (1000 bytes)"),
        "{r}"
    );
    // JavaScript's refusal is fetch's TypeError, with the same reason.
    let r = run(
        &c,
        "javascript",
        "try { await fetch('http://example.org/') } catch (e) { console.log(e.name, e.message, e.cause.code) }",
        json!({}),
    )
    .await;
    assert_eq!(
        r["stdout"],
        format!(
            "TypeError fetch failed: example.org:80 is not an allowed host: WASMBOX_ALLOW_HOSTS=127.0.0.1:{port} does not include it ECONNREFUSED\n"
        ),
        "{r}"
    );
    // A call may narrow the list, never widen it.
    let wider = call(
        &c,
        "execute_code",
        json!({"code": "print(1)", "allow_hosts": ["example.com"]}),
    )
    .await;
    assert!(is_error(&wider), "{:?}", wider.content);
    let text = format!("{:?}", wider.content);
    assert!(
        text.contains("allow_hosts may only narrow") && text.contains("example.com"),
        "{text}"
    );
    let narrowed = run(
        &c,
        "python",
        &code(&format!("{base}/data.csv")),
        json!({"allow_hosts": [format!("127.0.0.1:{port}")]}),
    )
    .await;
    assert_eq!(narrowed["stdout"], "", "{narrowed}");
    c.cancel().await.unwrap();

    // Without WASMBOX_ALLOW_PRIVATE_HOSTS a name that resolves to loopback is refused by its
    // address, and so is the address itself; with no list at all the network is off.
    let c = server_with_env(&[(
        "WASMBOX_ALLOW_HOSTS",
        &format!("localhost:{port},127.0.0.1:{port}"),
    )])
    .await;
    for host in ["localhost", "127.0.0.1"] {
        let r = run(
            &c,
            "python",
            &code(&format!("http://{host}:{port}/data.csv")),
            json!({}),
        )
        .await;
        let out = r["stdout"].as_str().unwrap();
        assert!(
            out.starts_with("ConnectionRefusedError ")
                && out.contains("127.0.0.1 is a loopback address")
                && out.contains("WASMBOX_ALLOW_PRIVATE_HOSTS=1"),
            "{host}: {r}"
        );
    }
    c.cancel().await.unwrap();
    let c = server().await;
    let r = run(&c, "python", &code(&format!("{base}/data.csv")), json!({})).await;
    assert!(
        r["stdout"]
            .as_str()
            .unwrap()
            .contains("guest network is off; set WASMBOX_ALLOW_HOSTS"),
        "{r}"
    );
    c.cancel().await.unwrap();
}

/// A guest waiting on the host holds no CPU slot, stops at its deadline (the request is
/// dropped), and its run's calls are budgeted.
#[tokio::test]
async fn waiting_on_the_host_is_a_wait() {
    let addr = site().await;
    let base = format!("http://{addr}");
    let mut env = allowing(addr);
    env.push(("WASMBOX_CONCURRENCY".into(), "1".into()));
    env.push(("WASMBOX_HOST_CALLS".into(), "2".into()));
    let c = server_for(&env).await;
    let slow = format!("import urllib.request\nurllib.request.urlopen('{base}/slow')");
    let started = Instant::now();
    let (waiting, quick) = tokio::join!(run(&c, "python", &slow, json!({"timeout": 3})), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = run(&c, "python", "print('through')", json!({})).await;
        (r, started.elapsed())
    });
    let (quick, quick_at) = quick;
    assert_eq!(quick["stdout"], "through\n", "{quick}");
    assert!(
        quick_at < Duration::from_millis(2500),
        "the only CPU slot was held by a guest waiting on the host: {quick_at:?}"
    );
    assert_eq!(waiting["exit_code"], 124, "{waiting}");
    assert_eq!(waiting["limit"], "timeout", "{waiting}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let r = run(
        &c,
        "python",
        &format!(
            r#"
import urllib.request
for i in range(3):
    try:
        print(len(urllib.request.urlopen("{base}/data.csv").read()))
    except OSError as e:
        print(e)
"#
        ),
        json!({}),
    )
    .await;
    assert_eq!(
        r["stdout"],
        "12\n12\nthis run has made all the host calls it may (2; WASMBOX_HOST_CALLS)\n",
        "{r}"
    );
    c.cancel().await.unwrap();
}

/// A cancelled call stops its guest while it waits on the host: with room for one live guest,
/// the next call would otherwise wait out the queue and be refused.
#[tokio::test]
async fn cancel_stops_a_guest_waiting_on_the_host() {
    let addr = site().await;
    let mut env = allowing(addr);
    env.push(("WASMBOX_CONCURRENCY".into(), "1".into()));
    env.push(("WASMBOX_MAX_GUESTS".into(), "1".into()));
    env.push(("WASMBOX_QUEUE_WAIT_S".into(), "5".into()));
    let c = server_for(&env).await;
    let code = format!("import urllib.request\nurllib.request.urlopen('http://{addr}/slow')");
    crate::cancel::cancel_after(
        &c,
        "execute_code",
        json!({"code": code, "timeout": 60}),
        Duration::from_millis(700),
    )
    .await;
    let started = Instant::now();
    let r = run(&c, "python", "print(2)", json!({})).await;
    assert_eq!(r["stdout"], "2\n", "{r}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    c.cancel().await.unwrap();
}

/// A site that records the Authorization headers it gets and echoes them back.
async fn recorder() -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = seen.clone();
    let app = axum::Router::new().route(
        "/auth",
        get(move |headers: HeaderMap| {
            let log = log.clone();
            async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                log.lock().unwrap().push(auth.clone());
                ([("x-echo", auth.clone())], format!("you sent {auth}"))
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

/// A secret lent with WASMBOX_SECRETS reaches its own host only; the guest sees a placeholder,
/// and an echo of the value comes back as the placeholder.
#[tokio::test]
async fn secrets_go_to_their_hosts_only_and_never_reach_the_guest() {
    const VALUE: &str = "s3cr3t-value-9f2c";
    let (a, seen_a) = recorder().await;
    let (b, seen_b) = recorder().await;
    let c = server_with_env(&[
        (
            "WASMBOX_ALLOW_HOSTS",
            &format!("127.0.0.1:{},127.0.0.1:{}", a.port(), b.port()),
        ),
        ("WASMBOX_ALLOW_PRIVATE_HOSTS", "1"),
        ("WASMBOX_SECRETS", &format!("TOKEN@127.0.0.1:{}", a.port())),
        ("TOKEN", VALUE),
    ])
    .await;
    let code = format!(
        r#"
import os, urllib.request
t = os.environ["TOKEN"]
print(t.startswith("WASMBOX_SECRET_TOKEN_"))
for site in ("{a}", "{b}"):
    r = urllib.request.urlopen(urllib.request.Request("http://" + site + "/auth", headers={{"Authorization": "Bearer " + t}}))
    print(r.read().decode() == "you sent Bearer " + t, r.headers["x-echo"] == "Bearer " + t)
"#
    );
    let r = run(&c, "python", &code, json!({})).await;
    assert_eq!(r["stdout"], "True\nTrue True\nTrue True\n", "{r}");
    assert!(!r.to_string().contains(VALUE), "{r}");
    let js = format!(
        "const t = process.env.TOKEN; const r = await fetch('http://{a}/auth', {{headers: {{authorization: t}}}}); console.log((await r.text()) === 'you sent ' + t)"
    );
    let r = run(&c, "javascript", &js, json!({})).await;
    assert_eq!(r["stdout"], "true\n", "{r}");
    let seen_a = seen_a.lock().unwrap().clone();
    let seen_b = seen_b.lock().unwrap().clone();
    assert_eq!(
        seen_a,
        [format!("Bearer {VALUE}"), VALUE.to_string()],
        "the secret's own host gets the value"
    );
    assert_eq!(seen_b.len(), 1);
    assert!(
        seen_b[0].starts_with("Bearer WASMBOX_SECRET_TOKEN_"),
        "another host gets the placeholder: {seen_b:?}"
    );
    c.cancel().await.unwrap();
}

/// A sandbox's allow_hosts narrows what its runs (sessions, forks) may reach, and is kept.
#[tokio::test]
async fn a_sandbox_keeps_its_narrower_hosts() {
    let a = site().await;
    let b = site().await;
    let c = server_with_env(&[
        (
            "WASMBOX_ALLOW_HOSTS",
            &format!("127.0.0.1:{},127.0.0.1:{}", a.port(), b.port()),
        ),
        ("WASMBOX_ALLOW_PRIVATE_HOSTS", "1"),
    ])
    .await;
    let wider = call(
        &c,
        "create_sandbox",
        json!({"allow_hosts": ["example.com"]}),
    )
    .await;
    assert!(is_error(&wider), "{:?}", wider.content);
    let id = create_sandbox(
        &c,
        json!({"allow_hosts": [format!("127.0.0.1:{}", a.port())]}),
    )
    .await;
    let info = ok(&c, "get_sandbox", json!({"id": id})).await;
    assert_eq!(
        info["allow_hosts"],
        json!([format!("127.0.0.1:{}", a.port())]),
        "{info}"
    );
    let code = format!(
        r#"
import urllib.request
for site in ("{a}", "{b}"):
    try:
        print(len(urllib.request.urlopen("http://" + site + "/data.csv").read()))
    except OSError as e:
        print(type(e).__name__, "allow_hosts" in str(e))
"#
    );
    let want = "12\nConnectionRefusedError True\n";
    let r = ok(
        &c,
        "execute_code",
        json!({"code": code, "mode": "persistent", "sandbox_id": id}),
    )
    .await;
    assert_eq!(r["stdout"], want, "{r}");
    let fork = ok(&c, "fork_sandbox", json!({"sandbox_id": id})).await;
    let child = fork["id"].as_str().unwrap().to_string();
    let r = ok(
        &c,
        "execute_code",
        json!({"code": code, "mode": "persistent", "sandbox_id": child}),
    )
    .await;
    assert_eq!(r["stdout"], want, "the fork keeps the list: {r}");
    // A call in it may narrow further, not widen.
    let r = call(
        &c,
        "execute_code",
        json!({"code": "print(1)", "mode": "persistent", "sandbox_id": id, "allow_hosts": [format!("127.0.0.1:{}", b.port())]}),
    )
    .await;
    assert!(is_error(&r), "{:?}", r.content);
    c.cancel().await.unwrap();
}

/// An open redirect and an echo, each request's target logged.
async fn open_redirect() -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = seen.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri, headers: HeaderMap| {
        let log = log.clone();
        async move {
            let auth = headers
                .get("authorization")
                .map(|v| v.to_str().unwrap_or("").to_string());
            log.lock().unwrap().push(format!("{uri} {auth:?}"));
            let to = uri.query().and_then(|q| {
                url::form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == "to")
                    .map(|(_, v)| v.into_owned())
            });
            match to {
                Some(to) => (StatusCode::FOUND, [(header::LOCATION, to)]).into_response(),
                None => format!("echo {uri}").into_response(),
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

/// #54: a secret's value does not ride an open redirect on its own host to another allowed
/// host. The guest asks the secret's host for `/open?to=http://other/echo?leak=<placeholder>`;
/// the host gets the value (its own) and sends it back in `Location`; the next hop goes out
/// with the placeholder, the value put back only for the secret's hosts. Before, the other host
/// received the value in its query string (and an echo of it in any percent-encoding reached
/// the guest).
#[tokio::test]
async fn a_secret_does_not_ride_an_open_redirect_to_another_host() {
    const VALUE: &str = "s3cr3t value/9f2c";
    let (a, seen_a) = open_redirect().await;
    let (b, seen_b) = open_redirect().await;
    let c = server_with_env(&[
        (
            "WASMBOX_ALLOW_HOSTS",
            &format!("127.0.0.1:{},127.0.0.1:{}", a.port(), b.port()),
        ),
        ("WASMBOX_ALLOW_PRIVATE_HOSTS", "1"),
        ("WASMBOX_SECRETS", &format!("TOKEN@127.0.0.1:{}", a.port())),
        ("TOKEN", VALUE),
    ])
    .await;
    let code = format!(
        r#"
import os, urllib.parse, urllib.request
t = os.environ["TOKEN"]
for back in ("http://{a}/echo?mine=" + t, "http://{b}/echo?leak=" + t):
    url = "http://{a}/open?to=" + urllib.parse.quote(back, safe="")
    r = urllib.request.urlopen(urllib.request.Request(url, headers={{"Authorization": "Bearer " + t}}))
    print(r.read().decode(), r.url)
"#
    );
    let r = run(&c, "python", &code, json!({})).await;
    let out = r["stdout"].as_str().unwrap();
    assert_eq!(out.lines().count(), 2, "{r}");
    assert!(
        !r.to_string().contains("s3cr3t"),
        "the guest saw the value: {r}"
    );
    let seen_a = seen_a.lock().unwrap().clone();
    let seen_b = seen_b.lock().unwrap().clone();
    let encoded = "s3cr3t%20value";
    assert!(
        seen_a.iter().filter(|s| s.contains(encoded)).count() >= 3,
        "the secret's own host gets the value on each of its hops: {seen_a:?}"
    );
    assert_eq!(seen_b.len(), 1, "{seen_b:?}");
    assert!(
        !seen_b[0].contains("s3cr3t") && seen_b[0].contains("WASMBOX_SECRET_TOKEN_"),
        "the other host gets the placeholder: {seen_b:?}"
    );
    assert!(
        seen_b[0].ends_with("None"),
        "no credentials cross: {seen_b:?}"
    );
    c.cancel().await.unwrap();
}
