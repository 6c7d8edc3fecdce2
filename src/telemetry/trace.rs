//! Spans: the subscriber (stderr, and OTLP when `OTEL_EXPORTER_OTLP_*` asks), and a call's span with the client's `traceparent` as its parent.
