//! Counters and histograms the request path bumps, and their encoding as Prometheus text.
//!
//! The request path only adds to process-wide atomics (a call's count takes a short lock on a
//! map keyed by tool). A scrape copies them into [`Figures`], to which the front adds what it
//! reads from the service at that moment (pools, sessions, slots, queues, disk); the same
//! `Figures` become the OpenMetrics text of `/metrics` and the `figures` of
//! `get_system_metrics`, so both always carry the same names.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde_json::{Map, Value, json};

/// A tool call's outcomes, as the call wrapper names them; anything else counts as "other".
pub const OUTCOMES: [&str; 8] = [
    "ok",
    "failed",
    "limit",
    "error",
    "refused",
    "cancelled",
    "input_required",
    "other",
];

/// Calls by tool, each with a count per [`OUTCOMES`]. Tools are the server's own names (or
/// "unknown"), so the map stays small.
static CALLS: LazyLock<Mutex<HashMap<Box<str>, [u64; OUTCOMES.len()]>>> =
    LazyLock::new(Mutex::default);

/// Counts one tool call that ended with `outcome`.
pub fn call(tool: &str, outcome: &str) {
    let i = OUTCOMES
        .iter()
        .position(|o| *o == outcome)
        .unwrap_or(OUTCOMES.len() - 1);
    let mut calls = CALLS.lock().unwrap_or_else(|e| e.into_inner());
    match calls.get_mut(tool) {
        Some(c) => c[i] += 1,
        None => {
            let mut c = [0; OUTCOMES.len()];
            c[i] = 1;
            calls.insert(tool.into(), c);
        }
    }
}

const HOST_KINDS: [&str; 2] = ["http", "tool"];
const HOST_OUTCOMES: [&str; 3] = ["ok", "error", "refused"];
static HOST_CALLS: [[AtomicU64; HOST_OUTCOMES.len()]; HOST_KINDS.len()] =
    [const { [const { AtomicU64::new(0) }; HOST_OUTCOMES.len()] }; HOST_KINDS.len()];

/// Counts one host call a guest made: `kind` "http" or "tool", `outcome` "ok", "error" or
/// "refused" (an unknown one counts as an error).
pub fn host_call(kind: &'static str, outcome: &'static str) {
    let k = usize::from(kind == "tool");
    let o = HOST_OUTCOMES
        .iter()
        .position(|x| *x == outcome)
        .unwrap_or(1);
    HOST_CALLS[k][o].fetch_add(1, Relaxed);
}

/// What a latency was measured around.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    /// A one-shot, from the request's validation to its result (runtime load and queue included).
    Oneshot,
    /// A run in a sandbox (a session's turn, or a fresh instance on its files).
    Turn,
}

const RUNS: [&str; 2] = ["oneshot", "turn"];
/// Languages a latency is kept for; any other counts as "other".
const LANGUAGES: [&str; 5] = ["python", "javascript", "go", "bash", "other"];
/// Upper bounds of the latency buckets, in microseconds: 0.25 ms to the longest timeout.
const BOUNDS_US: [u64; 19] = [
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    120_000_000,
    300_000_000,
];

/// One latency histogram: a count per bucket (the last past every bound) and the sum.
struct Hist {
    buckets: [AtomicU64; BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Hist {
    const fn new() -> Self {
        Self {
            buckets: [const { AtomicU64::new(0) }; BOUNDS_US.len() + 1],
            sum_us: AtomicU64::new(0),
        }
    }
}

static LATENCY: [[Hist; LANGUAGES.len()]; RUNS.len()] =
    [const { [const { Hist::new() }; LANGUAGES.len()] }; RUNS.len()];

/// Records how long a run of `language` took: two relaxed atomic adds.
pub fn latency(run: Run, language: &str, took: Duration) {
    let l = LANGUAGES
        .iter()
        .position(|x| *x == language)
        .unwrap_or(LANGUAGES.len() - 1);
    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    let b = BOUNDS_US.partition_point(|bound| *bound < us);
    let h = &LATENCY[run as usize][l];
    h.buckets[b].fetch_add(1, Relaxed);
    h.sum_us.fetch_add(us, Relaxed);
}

/// Tool calls over HTTP waiting in their token's queue for a running place.
static TOKEN_QUEUE: AtomicU64 = AtomicU64::new(0);

/// Counts a call in its token's queue while held.
pub struct InTokenQueue(());

impl InTokenQueue {
    pub fn enter() -> Self {
        TOKEN_QUEUE.fetch_add(1, Relaxed);
        Self(())
    }
}

impl Drop for InTokenQueue {
    fn drop(&mut self) {
        TOKEN_QUEUE.fetch_sub(1, Relaxed);
    }
}

/// Calls waiting in the HTTP tokens' queues now.
pub fn token_queue() -> u64 {
    TOKEN_QUEUE.load(Relaxed)
}

/// What a family of samples is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Counter,
    Gauge,
    Histogram,
}

/// One sample's value.
#[derive(Clone, Debug)]
pub enum Figure {
    Counter(u64),
    Gauge(i64),
    /// Per-bucket counts (not cumulative) by upper bound in seconds, the last one `+Inf`; the
    /// count is their sum.
    Histogram {
        sum: f64,
        buckets: Vec<(f64, u64)>,
    },
}

/// One labelled sample.
#[derive(Clone, Debug)]
pub struct Sample {
    pub labels: Vec<(&'static str, String)>,
    pub value: Figure,
}

/// One metric: its name as written (a counter's without `_total`, which the encoder adds),
/// its help, and its samples.
#[derive(Clone, Debug)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Type,
    pub samples: Vec<Sample>,
}

impl Family {
    /// The name its samples carry: a counter's with `_total`.
    pub fn sample_name(&self) -> String {
        match self.kind {
            Type::Counter => format!("{}_total", self.name),
            Type::Gauge | Type::Histogram => self.name.to_string(),
        }
    }
}

/// Every figure at one moment, in order.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub families: Vec<Family>,
}

impl Figures {
    /// The figures the request path counted: calls, latencies, host calls, dropped audit lines.
    pub fn counted() -> Self {
        let mut f = Self::default();
        let mut calls: Vec<Sample> = Vec::new();
        {
            let map = CALLS.lock().unwrap_or_else(|e| e.into_inner());
            for (tool, counts) in map.iter() {
                for (outcome, n) in OUTCOMES.iter().zip(counts) {
                    if *n > 0 {
                        calls.push(Sample {
                            labels: vec![
                                ("tool", tool.to_string()),
                                ("outcome", outcome.to_string()),
                            ],
                            value: Figure::Counter(*n),
                        });
                    }
                }
            }
        }
        calls.sort_by(|a, b| a.labels.cmp(&b.labels));
        f.push(
            "wasmbox_calls",
            "Tool calls, by tool and outcome.",
            Type::Counter,
            calls,
        );
        let mut hists = Vec::new();
        for (run, row) in RUNS.iter().zip(&LATENCY) {
            for (language, h) in LANGUAGES.iter().zip(row) {
                let counts: Vec<u64> = h.buckets.iter().map(|b| b.load(Relaxed)).collect();
                if counts.iter().all(|c| *c == 0) {
                    continue;
                }
                let buckets = BOUNDS_US
                    .iter()
                    .map(|us| *us as f64 / 1e6)
                    .chain([f64::INFINITY])
                    .zip(counts)
                    .collect();
                hists.push(Sample {
                    labels: vec![
                        ("kind", run.to_string()),
                        ("language", language.to_string()),
                    ],
                    value: Figure::Histogram {
                        sum: h.sum_us.load(Relaxed) as f64 / 1e6,
                        buckets,
                    },
                });
            }
        }
        f.push(
            "wasmbox_run_duration_seconds",
            "How long one-shots (kind=oneshot) and runs in a sandbox (kind=turn) took, queue and runtime load included, by language.",
            Type::Histogram,
            hists,
        );
        let mut host = Vec::new();
        for (kind, row) in HOST_KINDS.iter().zip(&HOST_CALLS) {
            for (outcome, n) in HOST_OUTCOMES.iter().zip(row) {
                host.push(Sample {
                    labels: vec![("kind", kind.to_string()), ("outcome", outcome.to_string())],
                    value: Figure::Counter(n.load(Relaxed)),
                });
            }
        }
        f.push(
            "wasmbox_host_calls",
            "Calls guests made through the host: HTTP requests (kind=http) and code-mode tool calls (kind=tool), by outcome.",
            Type::Counter,
            host,
        );
        f.one(
            "wasmbox_audit_lines_dropped",
            "Audit lines dropped because the audit writer fell behind.",
            Figure::Counter(super::audit::dropped()),
        );
        f
    }

    pub fn push(
        &mut self,
        name: &'static str,
        help: &'static str,
        kind: Type,
        samples: Vec<Sample>,
    ) {
        self.families.push(Family {
            name,
            help,
            kind,
            samples,
        });
    }

    /// A metric with a single sample and no labels.
    pub fn one(&mut self, name: &'static str, help: &'static str, value: Figure) {
        let kind = match value {
            Figure::Counter(_) => Type::Counter,
            Figure::Gauge(_) => Type::Gauge,
            Figure::Histogram { .. } => Type::Histogram,
        };
        let samples = vec![Sample {
            labels: Vec::new(),
            value,
        }];
        self.push(name, help, kind, samples);
    }

    /// The OpenMetrics text exposition (what prometheus-client writes, `# EOF` included).
    pub fn encode(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String does not fail");
        out
    }

    /// The figures as JSON, by the name their samples carry in the text: each an array of
    /// `{"labels": {..}, "value": n}`, or for a histogram `{"labels", "count", "sum", "buckets":
    /// [{"le": seconds, "count": cumulative}, ..]}` (the `+Inf` bucket is `count`).
    pub fn to_json(&self) -> Map<String, Value> {
        let mut out = Map::new();
        for f in &self.families {
            let samples = f
                .samples
                .iter()
                .map(|s| {
                    let labels: Map<String, Value> = s
                        .labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), json!(v)))
                        .collect();
                    match &s.value {
                        Figure::Counter(n) => json!({"labels": labels, "value": n}),
                        Figure::Gauge(n) => json!({"labels": labels, "value": n}),
                        Figure::Histogram { sum, buckets } => {
                            let mut total = 0;
                            let mut cumulative = Vec::new();
                            for (le, n) in buckets {
                                total += n;
                                if le.is_finite() {
                                    cumulative.push(json!({"le": le, "count": total}));
                                }
                            }
                            json!({"labels": labels, "count": total, "sum": sum, "buckets": cumulative})
                        }
                    }
                })
                .collect();
            out.insert(f.sample_name(), Value::Array(samples));
        }
        out
    }
}

impl Collector for Figures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            let kind = match f.kind {
                Type::Counter => MetricType::Counter,
                Type::Gauge => MetricType::Gauge,
                Type::Histogram => MetricType::Histogram,
            };
            let mut metric = encoder.encode_descriptor(f.name, f.help, None, kind)?;
            match f.samples.as_slice() {
                // Without labels, not `{}`: text parsers read that as no sample at all.
                [s] if s.labels.is_empty() => encode_value(&s.value, metric)?,
                samples => {
                    for s in samples {
                        encode_value(&s.value, metric.encode_family(&s.labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn encode_value(value: &Figure, mut sample: MetricEncoder) -> Result<(), std::fmt::Error> {
    match value {
        Figure::Counter(n) => ConstCounter::new(*n).encode(sample),
        Figure::Gauge(n) => ConstGauge::new(*n).encode(sample),
        Figure::Histogram { sum, buckets } => {
            let count = buckets.iter().map(|(_, n)| n).sum();
            sample.encode_histogram::<NoLabelSet>(*sum, count, buckets, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_openmetrics_text() {
        call("execute_code", "ok");
        call("execute_code", "ok");
        call("execute_code", "nonsense");
        host_call("http", "refused");
        latency(Run::Oneshot, "python", Duration::from_micros(300));
        latency(Run::Oneshot, "python", Duration::from_secs(400));
        let mut f = Figures::counted();
        f.one("wasmbox_test_gauge", "A gauge.", Figure::Gauge(-3));
        let text = f.encode();
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("# TYPE wasmbox_calls counter\n"), "{text}");
        assert!(
            text.contains("wasmbox_calls_total{tool=\"execute_code\",outcome=\"ok\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("wasmbox_calls_total{tool=\"execute_code\",outcome=\"other\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("wasmbox_host_calls_total{kind=\"http\",outcome=\"refused\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("wasmbox_test_gauge -3\n"), "{text}");
        let labels = "kind=\"oneshot\",language=\"python\"";
        // Other tests in this binary may have added runs: check the shape, not the numbers.
        let bucket = |le: &str| -> u64 {
            let key = format!("wasmbox_run_duration_seconds_bucket{{le=\"{le}\",{labels}}} ");
            let line = text.lines().find(|l| l.starts_with(&key)).expect(&key);
            line[key.len()..].parse().unwrap()
        };
        assert!(bucket("0.0005") >= 1);
        assert!(bucket("300.0") < bucket("+Inf"));
        let count_key = format!("wasmbox_run_duration_seconds_count{{{labels}}} ");
        let count: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&count_key))
            .expect("a count")
            .parse()
            .unwrap();
        assert_eq!(count, bucket("+Inf"));
        let json = f.to_json();
        assert_eq!(json["wasmbox_test_gauge"][0]["value"], -3);
        let h = json["wasmbox_run_duration_seconds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["labels"]["kind"] == "oneshot" && s["labels"]["language"] == "python")
            .unwrap();
        assert_eq!(h["count"], count);
        assert_eq!(h["buckets"].as_array().unwrap().len(), BOUNDS_US.len());
        for f in &f.families {
            assert!(json.contains_key(&f.sample_name()));
        }
    }
}
