//! Counters and histograms the request path bumps, and their encoding as Prometheus text.

/// Counts a tool call by tool and outcome.
pub fn call(_tool: &str, _outcome: &str) {}
