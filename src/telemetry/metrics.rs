//! Counters and histograms the request path bumps, and their encoding as Prometheus text.
