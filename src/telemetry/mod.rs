//! What the server did, visible to the people who run it: the audit log (`audit`), the figures
//! behind `/metrics` and `get_system_metrics` (`metrics`), and spans, exported over OTLP when
//! asked (`trace`). A ground room: it imports no other, so every floor can count into it.

pub mod audit;
pub mod metrics;
pub mod trace;
