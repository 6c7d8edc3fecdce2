//! Traces (#56): the real server, its exporter turned on by the standard `OTEL_*` variables,
//! sends its spans over OTLP/HTTP (protobuf) to a receiver on 127.0.0.1 in the test. The span
//! tree hangs under the client's `traceparent` (MCP's `_meta`); a call without one starts a
//! trace of its own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::header;
use axum::routing::{get, post};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, RequestParamsMeta};
use rmcp::transport::TokioChildProcess;
use serde_json::json;

use crate::common::*;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// What the receiver was sent: each span with its resource's `service.name`, and the number of
/// export requests.
#[derive(Clone, Default)]
struct Received {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
    posts: Arc<AtomicUsize>,
}

/// An OTLP/HTTP receiver (`POST /v1/traces`, as a collector's port 4318 answers it) that also
/// serves `GET /hello` to the guests.
async fn receiver() -> (SocketAddr, Received) {
    let got = Received::default();
    let g = got.clone();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            post(move |body: Bytes| {
                let g = g.clone();
                async move {
                    g.posts.fetch_add(1, Ordering::SeqCst);
                    let req = ExportTraceServiceRequest::decode(body)
                        .expect("the body is an OTLP/protobuf trace export");
                    let mut spans = g.spans.lock().unwrap();
                    for rs in req.resource_spans {
                        let service = rs
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|kv| kv.key == "service.name")
                            .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
                            .unwrap_or_default();
                        for ss in rs.scope_spans {
                            spans.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
                        }
                    }
                    (
                        [(header::CONTENT_TYPE, "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        )
        .route("/hello", get(|| async { "hello" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, got)
}

fn text(v: &Any) -> Option<String> {
    Some(match v {
        Any::StringValue(s) => s.clone(),
        Any::IntValue(i) => i.to_string(),
        Any::BoolValue(b) => b.to_string(),
        _ => return None,
    })
}

fn attr(s: &Span, key: &str) -> Option<String> {
    let kv = s.attributes.iter().find(|kv| kv.key == key)?;
    text(kv.value.as_ref()?.value.as_ref()?)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `wasmbox serve` over stdio with `env`, none of the caller's own `OTEL_*` variables, and its
/// stderr piped back.
async fn server(env: &[(&str, String)]) -> (Client, tokio::process::ChildStderr) {
    prepare();
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("serve")
        .env("WASMBOX_DATA", "none")
        .env("WASMBOX_PACKAGE_INDEX", NO_INDEX)
        .env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (transport, stderr) = TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning wasmbox serve");
    let client = ().serve(transport).await.expect("MCP handshake");
    (client, stderr.expect("the server's stderr"))
}

/// Polls until `done` holds for what was received (a liveness bound: the last spans come with
/// the server's exit).
async fn until(got: &Received, done: impl Fn(&[(String, Span)]) -> bool) -> Vec<(String, Span)> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let spans = got.spans.lock().unwrap().clone();
        if done(&spans) || Instant::now() > end {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn names(spans: &[(String, Span)]) -> Vec<String> {
    spans
        .iter()
        .map(|(_, s)| {
            format!(
                "{} trace={} id={} parent={}",
                s.name,
                hex(&s.trace_id),
                hex(&s.span_id),
                hex(&s.parent_span_id)
            )
        })
        .collect()
}

/// A call whose `_meta` carries a `traceparent` is that trace's child: its queue wait and guest
/// run under it, the guest's HTTP request under the run. A call without one is a root. The
/// batch processor is told to wait a minute: the spans arrive because closing the client ends
/// the server, which sends what it still holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_joins_the_clients_trace_and_the_server_flushes_on_exit() {
    let (addr, got) = receiver().await;
    let (client, _stderr) = server(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".into()),
        ("OTEL_BSP_SCHEDULE_DELAY", "60000".into()),
        ("WASMBOX_ALLOW_HOSTS", format!("127.0.0.1:{}", addr.port())),
        ("WASMBOX_ALLOW_PRIVATE_HOSTS", "1".into()),
    ])
    .await;
    let code = format!(
        "import urllib.request\nprint(urllib.request.urlopen('http://{addr}/hello').read().decode())"
    );
    let serde_json::Value::Object(args) = json!({"code": code, "language": "python"}) else {
        unreachable!()
    };
    let mut params = CallToolRequestParams::new("execute_code").with_arguments(args);
    params.set_traceparent(&format!("00-{TRACE}-{PARENT}-01"));
    let r = client.call_tool(params).await.expect("tools/call");
    assert!(!is_error(&r), "{:?}", r.content);
    assert_eq!(object(&r)["stdout"], "hello\n");
    assert_eq!(py(&client, "print(2)").await["stdout"], "2\n");
    client.cancel().await.unwrap();

    let calls = |s: &[(String, Span)]| s.iter().filter(|(_, s)| s.name == "call").count();
    let runs = |s: &[(String, Span)]| s.iter().filter(|(_, s)| s.name == "guest.run").count();
    let spans = until(&got, |s| calls(s) >= 2 && runs(s) >= 2).await;
    let all = names(&spans);
    let find = |name: &str, trace: &[u8], parent: &[u8]| {
        spans
            .iter()
            .find(|(_, s)| s.name == name && s.trace_id == trace && s.parent_span_id == parent)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| panic!("no {name} under {} in {all:#?}", hex(parent)))
    };
    let trace: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&TRACE[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let parent: Vec<u8> = (0..8)
        .map(|i| u8::from_str_radix(&PARENT[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let call = find("call", &trace, &parent);
    assert_eq!(attr(&call, "tool").as_deref(), Some("execute_code"));
    // SPAN_KIND_SERVER
    assert_eq!(call.kind, 2);
    find("queue.guest", &trace, &call.span_id);
    let run = find("guest.run", &trace, &call.span_id);
    let http = find("reach.http", &trace, &run.span_id);
    assert_eq!(attr(&http, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(
        attr(&http, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(attr(&http, "http.request.method").as_deref(), Some("GET"));

    // The call without a traceparent: a root of its own trace, its run under it.
    let (_, fresh) = spans
        .iter()
        .find(|(_, s)| s.name == "call" && s.trace_id != trace)
        .unwrap_or_else(|| panic!("no second call in {all:#?}"));
    assert!(fresh.parent_span_id.is_empty(), "{all:#?}");
    assert_ne!(hex(&fresh.trace_id), "0".repeat(32));
    find("guest.run", &fresh.trace_id, &fresh.span_id);

    // Only wasmbox's spans, under its name.
    for (service, s) in &spans {
        assert_eq!(service, "wasmbox", "{}", s.name);
        assert!(
            [
                "call",
                "queue.token",
                "queue.guest",
                "guest.run",
                "session.save",
                "reach.http",
                "reach.tool"
            ]
            .contains(&s.name.as_str()),
            "a span that is not wasmbox's: {all:#?}"
        );
    }
}

/// `OTEL_SDK_DISABLED=true` keeps the exporter off though an endpoint is set; so does a protocol
/// other than http/protobuf, which the server names on stderr.
#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_exported_when_disabled_or_asked_for_grpc() {
    use tokio::io::AsyncReadExt;
    let (addr, got) = receiver().await;
    let endpoint = format!("http://{addr}");
    for (k, v) in [
        ("OTEL_SDK_DISABLED", "true"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ] {
        let (client, mut stderr) = server(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50".into()),
            (k, v.into()),
        ])
        .await;
        assert_eq!(py(&client, "print(1)").await["stdout"], "1\n");
        client.cancel().await.unwrap();
        let mut log = String::new();
        stderr.read_to_string(&mut log).await.unwrap();
        if k == "OTEL_EXPORTER_OTLP_PROTOCOL" {
            assert!(
                log.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported")
                    && log.contains("http/protobuf"),
                "{log}"
            );
        } else {
            assert!(!log.contains("traces are not exported"), "{log}");
        }
        assert_eq!(got.posts.load(Ordering::SeqCst), 0, "{k}={v}: {log}");
    }
}
