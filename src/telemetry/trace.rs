//! Spans: the subscriber (stderr, and OTLP when `OTEL_EXPORTER_OTLP_*` asks), and a call's span
//! with the client's `traceparent` as its parent.
//!
//! The spans are at debug level: with OTLP off and `RUST_LOG` at its default, their callsites
//! are disabled and a span costs a level comparison. With OTLP on, only wasmbox's own spans and
//! events reach the exporter, so the exporter's HTTP client (and rmcp's) never trace
//! themselves into it.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing::{Level, Metadata, Span};
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};
use tracing_subscriber::filter::{FilterFn, Filtered, LevelFilter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Keeps the exporter until the process ends; [`Guard::shutdown`] (or a drop) sends what is
/// still queued.
#[must_use = "dropping the guard shuts the exporter down"]
pub struct Guard {
    provider: Option<SdkTracerProvider>,
}

impl Guard {
    /// Exports the spans still queued and stops the exporter (bounded by the SDK's 5 s).
    pub fn shutdown(mut self) {
        self.close();
    }

    fn close(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("wasmbox: the trace exporter did not shut down cleanly: {e}");
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.close();
    }
}

type OtelLayer = Filtered<OpenTelemetryLayer<Registry, SdkTracer>, FilterFn, Registry>;

/// Installs the process's subscriber: logs to stderr (stdout is the MCP protocol's in `serve`)
/// at `RUST_LOG`'s level or wasmbox's info, and spans over OTLP when the standard variables ask.
/// Call it before any runtime starts: the exporter's blocking client runs threads of its own.
pub fn init() -> Guard {
    let (otel, provider, problem) = match otlp_asked() {
        Asked::No => (None, None, None),
        Asked::Unsupported(why) => (None, None, Some(why)),
        Asked::Yes => match exporter() {
            Ok(provider) => (Some(layer(&provider)), Some(provider), None),
            Err(why) => (None, None, Some(why)),
        },
    };
    // info shows the one-time compile progress; nothing else logs at info outside `serve`. With
    // OTLP on, the SDK's own warnings (a collector that refuses or is down) show as well.
    let default = if provider.is_some() {
        "wasmbox=info,opentelemetry=warn"
    } else {
        "wasmbox=info"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    subscriber(otel, filter).init();
    if let Some(why) = problem {
        tracing::error!("traces are not exported: {why}");
    }
    Guard { provider }
}

/// The stderr log under `filter`, beside the OTLP layer when there is one.
fn subscriber(
    otel: Option<OtelLayer>,
    filter: EnvFilter,
) -> impl tracing::Subscriber + Send + Sync + 'static {
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    tracing_subscriber::registry().with(otel).with(stderr)
}

enum Asked {
    No,
    Yes,
    Unsupported(String),
}

/// Whether the standard variables turn the exporter on: an endpoint is set, the SDK is not
/// disabled and the traces exporter is not `none`. Only OTLP over HTTP/protobuf is built in.
fn otlp_asked() -> Asked {
    let var = |k: &str| {
        std::env::var(k)
            .ok()
            .map(|v| v.trim().to_ascii_lowercase())
            .filter(|v| !v.is_empty())
    };
    let endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
    if !endpoint
        || var("OTEL_SDK_DISABLED").as_deref() == Some("true")
        || var("OTEL_TRACES_EXPORTER").as_deref() == Some("none")
    {
        return Asked::No;
    }
    for k in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        match var(k).as_deref() {
            None => continue,
            Some("http/protobuf") => break,
            Some(other) => {
                return Asked::Unsupported(format!(
                    "{k}={other} is not supported: wasmbox exports OTLP over http/protobuf only (a collector's port 4318); set {k}=http/protobuf"
                ));
            }
        }
    }
    Asked::Yes
}

/// The tracer provider: a batch processor (its own thread) over the OTLP HTTP/protobuf
/// exporter, which reads the rest of `OTEL_EXPORTER_OTLP_*` and `OTEL_BSP_*` itself.
fn exporter() -> Result<SdkTracerProvider, String> {
    // The exporter's client is reqwest 0.13 built without a crypto library of its own: it
    // panics unless the process has a default (a later install elsewhere finds this one).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("building the OTLP exporter: {e}"))?;
    // OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES' service.name wins; else "wasmbox", not the
    // SDK's `unknown_service:<executable>`.
    let named = opentelemetry_sdk::Resource::builder()
        .build()
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !named {
        resource = resource.with_service_name("wasmbox");
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

fn layer(provider: &SdkTracerProvider) -> OtelLayer {
    let scope = opentelemetry::InstrumentationScope::builder("wasmbox")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer_with_scope(scope))
        .with_filter(
            FilterFn::new(ours as fn(&Metadata<'_>) -> bool)
                .with_max_level_hint(LevelFilter::DEBUG),
        )
}

/// wasmbox's spans (debug and up) and its events (info and up, recorded on their span).
fn ours(m: &Metadata<'_>) -> bool {
    let level = if m.is_span() {
        Level::DEBUG
    } else {
        Level::INFO
    };
    m.target().starts_with("wasmbox") && *m.level() <= level
}

/// The span of one tool call: a child of the client's `traceparent` (MCP's `_meta`) when it
/// sent a valid one, else the root of a trace of its own. The caller may record `outcome` and
/// `otel.status_code` (`"ERROR"`) on it when the call ends.
pub fn call_span(tool: &str, traceparent: Option<&str>, tracestate: Option<&str>) -> Span {
    let span = tracing::debug_span!(
        parent: None,
        "call",
        tool = %tool,
        otel.kind = "server",
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if let Some(traceparent) = traceparent
        && !span.is_disabled()
    {
        let cx = TraceContextPropagator::new().extract(&W3c {
            traceparent,
            tracestate,
        });
        if cx.span().span_context().is_valid() {
            // Fails only without the OTLP layer (a span shown on stderr alone): nothing to join.
            let _ = span.set_parent(cx);
        }
    }
    span
}

/// The OTel trace id of `span` (32 hex digits), when it is exported.
pub fn trace_id(span: &Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// The two W3C Trace Context fields, as the propagator reads a carrier.
struct W3c<'a> {
    traceparent: &'a str,
    tracestate: Option<&'a str>,
}

impl Extractor for W3c<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => Some(self.traceparent),
            "tracestate" => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::SpanId;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SpanData, SpanExporter};
    use tracing::Subscriber;

    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT: &str = "00f067aa0ba902b7";

    #[derive(Clone, Debug, Default)]
    struct Kept(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Kept {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    fn info() -> EnvFilter {
        EnvFilter::new("wasmbox=info")
    }

    /// With OTLP off and the default filter, the spans are below the process's level: their
    /// macros return at the level check, before any callsite or field is looked at.
    #[test]
    fn without_otlp_the_spans_are_filtered_by_level() {
        let sub = subscriber(None, info());
        assert_eq!(sub.max_level_hint(), Some(LevelFilter::INFO));
        tracing::subscriber::with_default(sub, || {
            let tp = format!("00-{TRACE}-{PARENT}-01");
            let span = call_span("execute_code", Some(&tp), None);
            assert!(span.is_disabled());
            assert_eq!(trace_id(&span), None);
        });
    }

    #[test]
    fn a_call_joins_the_traceparent_and_only_wasmbox_spans_are_exported() {
        let kept = Kept::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(kept.clone())
            .build();
        let sub = subscriber(Some(layer(&provider)), info());
        assert_eq!(sub.max_level_hint(), Some(LevelFilter::DEBUG));
        let (joined, fresh) = tracing::subscriber::with_default(sub, || {
            let tp = format!("00-{TRACE}-{PARENT}-01");
            let call = call_span("execute_code", Some(&tp), Some("k=v"));
            let joined = trace_id(&call);
            call.in_scope(|| {
                tracing::debug_span!("guest.run").in_scope(|| {
                    tracing::debug_span!(target: "rmcp::service", "serve_inner").in_scope(|| {});
                    tracing::info!("a note on the run");
                });
            });
            drop(call);
            let fresh = call_span("execute_code", None, None);
            let id = trace_id(&fresh);
            drop(fresh);
            let bad = call_span("execute_code", Some("00-zz-yy-01"), None);
            (joined, (id, trace_id(&bad)))
        });
        provider.shutdown().unwrap();
        assert_eq!(joined.as_deref(), Some(TRACE));
        let spans = kept.0.lock().unwrap().clone();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["guest.run", "call", "call", "call"], "{spans:#?}");
        let (run, call) = (&spans[0], &spans[1]);
        assert_eq!(call.span_context.trace_id().to_string(), TRACE);
        assert_eq!(call.parent_span_id, SpanId::from_hex(PARENT).unwrap());
        assert!(call.parent_span_is_remote);
        assert_eq!(run.parent_span_id, call.span_context.span_id());
        assert_eq!(run.events.len(), 1, "the info event rides on its span");
        // Without a traceparent, or with a malformed one: a root of a new trace.
        let (fresh, bad) = fresh;
        for (s, id) in [(&spans[2], fresh), (&spans[3], bad)] {
            assert_eq!(s.parent_span_id, SpanId::INVALID);
            let id = id.expect("an exported span has a trace id");
            assert_eq!(s.span_context.trace_id().to_string(), id);
            assert_ne!(id, TRACE);
        }
    }
}
