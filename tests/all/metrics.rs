//! `GET /metrics` (behind the bearer token, OpenMetrics text a Prometheus parser reads) and
//! `get_system_metrics`' `figures`, which carry the same metrics over MCP (stdio included).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::{HttpServer, create_sandbox, ok};
use prometheus_parse::{Sample, Scrape, Value as Figure};
use serde_json::{Value, json};

const TOKEN: &str = "token-metrics-0123456789abcdef";

/// A sample's number (counters show as untyped: OpenMetrics names them `x_total` under
/// `# TYPE x counter`, which this lenient parser does not pair).
fn number(s: &Sample) -> f64 {
    match &s.value {
        Figure::Counter(v) | Figure::Gauge(v) | Figure::Untyped(v) => *v,
        other => panic!("{} is not a number: {other:?}", s.metric),
    }
}

fn find<'a>(scrape: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
}

/// The metrics a text declares (`# TYPE`), by the name their samples carry.
fn declared(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| match l.split_once(' ') {
            Some((name, "counter")) => format!("{name}_total"),
            Some((name, _)) => name.to_string(),
            None => panic!("a TYPE line without a type: {l}"),
        })
        .collect()
}

/// Parses a scrape, checking that the parser (which skips lines it cannot read) took every
/// data line: one per sample, one per bucket of a histogram.
fn parse(text: &str) -> Scrape {
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics ends with # EOF: {text}"
    );
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parses");
    let lines = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .count();
    let read: usize = scrape
        .samples
        .iter()
        .map(|s| match &s.value {
            Figure::Histogram(b) => b.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(read, lines, "every data line is a sample:\n{text}");
    scrape
}

/// The run-time histogram for `kind` and python: its buckets rise, `+Inf` is the count, and
/// the count is returned.
fn python_histogram(scrape: &Scrape, kind: &str) -> f64 {
    let labels = [("kind", kind), ("language", "python")];
    let h = find(scrape, "wasmbox_run_duration_seconds", &labels)
        .unwrap_or_else(|| panic!("a {kind} histogram for python"));
    let Figure::Histogram(buckets) = &h.value else {
        panic!("not a histogram: {h:?}")
    };
    let mut buckets = buckets.clone();
    buckets.sort_by(|a, b| a.less_than.total_cmp(&b.less_than));
    assert!(
        buckets.windows(2).all(|w| w[0].count <= w[1].count),
        "{buckets:?}"
    );
    let last = buckets.last().unwrap();
    assert!(last.less_than.is_infinite(), "{buckets:?}");
    let count = number(find(scrape, "wasmbox_run_duration_seconds_count", &labels).unwrap());
    assert_eq!(last.count, count);
    assert!(count >= 1.0);
    count
}

async fn scrape(url: &str, token: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_over_http_behind_the_token_parse_and_match_the_tool() {
    let server = HttpServer::start(&[("WASMBOX_TOKEN", TOKEN)], &[]).await;
    let url = server.url.replace("/mcp", "/metrics");
    assert!(url.ends_with("/metrics"), "{url}");

    for token in [None, Some("not-the-token-0000000000")] {
        let resp = scrape(&url, token).await;
        assert_eq!(resp.status(), 401, "token {token:?}");
        let body = resp.text().await.unwrap();
        assert!(!body.contains("wasmbox_"), "{body}");
    }

    let client = server.client(TOKEN).await.unwrap();
    let v = ok(
        &client,
        "execute_code",
        json!({"code": "print(6*7)", "language": "python"}),
    )
    .await;
    assert_eq!(v["stdout"], "42\n");
    let id = create_sandbox(&client, json!({"template_id": "python"})).await;
    ok(
        &client,
        "execute_code",
        json!({"sandbox_id": id, "mode": "persistent", "code": "x = 1"}),
    )
    .await;

    let resp = scrape(&url, Some(TOKEN)).await;
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let text = resp.text().await.unwrap();
    let s = parse(&text);

    let calls = |tool: &str| {
        find(
            &s,
            "wasmbox_calls_total",
            &[("tool", tool), ("outcome", "ok")],
        )
        .map(number)
        .unwrap_or(0.0)
    };
    assert!(calls("execute_code") >= 2.0, "{text}");
    let hits: Vec<&Sample> = s
        .samples
        .iter()
        .filter(|x| x.metric == "wasmbox_pool_hits_total")
        .collect();
    assert!(!hits.is_empty(), "pool hits present: {text}");
    let python_takes: f64 = s
        .samples
        .iter()
        .filter(|x| {
            (x.metric == "wasmbox_pool_hits_total" || x.metric == "wasmbox_pool_misses_total")
                && x.labels.get("pool").is_some_and(|p| p.contains("python"))
        })
        .map(number)
        .sum();
    assert!(python_takes >= 1.0, "the one-shot took from a pool: {text}");
    python_histogram(&s, "oneshot");
    python_histogram(&s, "turn");
    let live = find(&s, "wasmbox_sessions", &[("state", "live")]).expect("sessions");
    assert!(number(live) >= 1.0, "{text}");
    assert!(number(find(&s, "wasmbox_sandboxes", &[]).unwrap()) >= 1.0);
    for class in ["foreground", "background"] {
        find(&s, "wasmbox_cpu_slots_busy", &[("class", class)]).expect("busy slots");
        find(&s, "wasmbox_cpu_slots_waiting", &[("class", class)]).expect("waiting");
    }
    for queue in ["guest", "token", "async"] {
        find(&s, "wasmbox_queue_length", &[("queue", queue)]).expect("a queue");
    }
    for (kind, outcome) in [("http", "ok"), ("tool", "refused")] {
        let labels = [("kind", kind), ("outcome", outcome)];
        find(&s, "wasmbox_host_calls_total", &labels).expect("host calls");
    }
    find(&s, "wasmbox_audit_lines_dropped_total", &[]).expect("dropped audit lines");
    let quota = number(find(&s, "wasmbox_disk_quota_bytes", &[]).unwrap());
    let used = number(find(&s, "wasmbox_disk_used_bytes", &[]).unwrap());
    assert!(quota > 0.0 && used <= quota, "{text}");

    // The tool carries the same metrics, and the same counts where nothing ran in between.
    let m = ok(&client, "get_system_metrics", json!({})).await;
    let figures = m["figures"].as_object().expect("figures");
    let names: BTreeSet<String> = figures.keys().cloned().collect();
    assert_eq!(names, declared(&text));
    let figure = |name: &str, labels: Value| -> Value {
        figures[name]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["labels"] == labels)
            .cloned()
            .unwrap_or_else(|| panic!("{name} {labels} in {m}"))
    };
    let c = figure(
        "wasmbox_calls_total",
        json!({"tool": "execute_code", "outcome": "ok"}),
    );
    assert_eq!(c["value"].as_f64(), Some(calls("execute_code")));
    let h = figure(
        "wasmbox_run_duration_seconds",
        json!({"kind": "oneshot", "language": "python"}),
    );
    assert_eq!(h["count"].as_f64(), Some(python_histogram(&s, "oneshot")));
    let buckets: Vec<u64> = h["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .collect();
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{h}");
    assert!(*buckets.last().unwrap() <= h["count"].as_u64().unwrap());
    // The fields HOPX clients read are still there.
    for key in [
        "uptime_seconds",
        "executions",
        "pools",
        "cpu_slots",
        "sandboxes",
    ] {
        assert!(m.get(key).is_some(), "{key} in {m}");
    }
    client.cancel().await.unwrap();

    // Over stdio the same metrics: names as /metrics declares them.
    let local = common::server().await;
    ok(
        &local,
        "execute_code",
        json!({"code": "print(1)", "language": "python"}),
    )
    .await;
    let m = ok(&local, "get_system_metrics", json!({})).await;
    let figures = m["figures"].as_object().expect("figures over stdio");
    let names: BTreeSet<String> = figures.keys().cloned().collect();
    assert_eq!(names, declared(&text));
    let by_outcome: BTreeMap<String, u64> = figures["wasmbox_calls_total"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["labels"]["tool"] == "execute_code")
        .map(|x| {
            let outcome = x["labels"]["outcome"].as_str().unwrap().to_string();
            (outcome, x["value"].as_u64().unwrap())
        })
        .collect();
    assert!(
        by_outcome.get("ok").is_some_and(|n| *n >= 1),
        "{by_outcome:?}"
    );
    local.cancel().await.unwrap();
}
