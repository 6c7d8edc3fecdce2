//! The scrape: what `GET /metrics` and `get_system_metrics`'s `figures` carry. The counts the
//! request path kept (`telemetry::metrics`) and what the service shows at this moment: instance
//! pools, sessions, CPU slots, queues, disk. Walking the sandboxes (locks, a look for each saved
//! state, the snapshots' directory) runs on the blocking pool, never on a request's worker.

use crate::Wasmbox;
use crate::sandbox::slot::SESSION_LANGUAGES;
use crate::telemetry::metrics::{Figure, Figures, Sample, Type, token_queue};

/// Every figure now.
pub async fn gather(wasmbox: &Wasmbox) -> Figures {
    let wb = wasmbox.clone();
    tokio::task::spawn_blocking(move || gather_now(&wb))
        .await
        .unwrap_or_else(|e| {
            tracing::warn!("gathering metrics: {e}");
            Figures::counted()
        })
}

/// A sample with labels.
fn labelled(labels: &[(&'static str, &str)], value: Figure) -> Sample {
    Sample {
        labels: labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
        value,
    }
}

fn gauge(n: usize) -> Figure {
    Figure::Gauge(i64::try_from(n).unwrap_or(i64::MAX))
}

fn bytes(n: u64) -> Figure {
    Figure::Gauge(i64::try_from(n).unwrap_or(i64::MAX))
}

fn gather_now(wb: &Wasmbox) -> Figures {
    let mut f = Figures::counted();
    f.one(
        "wasmbox_executions",
        "Runs started on a guest thread or as background work (one-shots, sandbox runs, jobs).",
        Figure::Counter(wb.executions()),
    );

    let pools = wb.pool_stats();
    let per_pool = |value: &dyn Fn(&crate::engine::pool::PoolStats) -> Figure| {
        pools
            .iter()
            .map(|p| labelled(&[("pool", &p.name)], value(p)))
            .collect::<Vec<_>>()
    };
    f.push(
        "wasmbox_pool_hits",
        "One-shots that found a ready instance in their runtime's pool.",
        Type::Counter,
        per_pool(&|p| Figure::Counter(p.hits)),
    );
    f.push(
        "wasmbox_pool_misses",
        "One-shots that found their runtime's pool empty and made an instance themselves.",
        Type::Counter,
        per_pool(&|p| Figure::Counter(p.misses)),
    );
    f.push(
        "wasmbox_pool_recycled",
        "Instances that served a one-shot, were reset to their state as made and went back to the pool.",
        Type::Counter,
        per_pool(&|p| Figure::Counter(p.recycled)),
    );
    f.push(
        "wasmbox_pool_ready",
        "Instances ready in each pool now.",
        Type::Gauge,
        per_pool(&|p| gauge(p.ready)),
    );

    let sandboxes = wb.sandboxes();
    let all = sandboxes.all();
    let (mut live, mut saved, mut used, mut quota) = (0usize, 0usize, 0u64, 0u64);
    for sb in &all {
        for language in SESSION_LANGUAGES {
            let Some(slot) = sb.slot(language) else {
                continue;
            };
            match slot.try_lock() {
                // In a call: live.
                Err(_) => live += 1,
                Ok(g) if g.is_live() => live += 1,
                Ok(_) if sb.state_path(language).is_file() => saved += 1,
                Ok(_) => {}
            }
        }
        used += sb.fs.budget().counted().0;
        quota += sb.fs.quota().max_bytes;
    }
    f.one(
        "wasmbox_sandboxes",
        "Sandboxes this server holds (every token's).",
        gauge(all.len()),
    );
    f.push(
        "wasmbox_sessions",
        "Language sessions: live (an interpreter in memory) and saved (on disk only, restored on the next call).",
        Type::Gauge,
        vec![
            labelled(&[("state", "live")], gauge(live)),
            labelled(&[("state", "saved")], gauge(saved)),
        ],
    );

    let load = wb.load();
    let classes = |(fg, bg): (usize, usize)| {
        vec![
            labelled(&[("class", "foreground")], gauge(fg)),
            labelled(&[("class", "background")], gauge(bg)),
        ]
    };
    f.one(
        "wasmbox_cpu_slots",
        "CPU slots: guests computing at once (WASMBOX_CONCURRENCY).",
        gauge(load.cpu_slots),
    );
    f.push(
        "wasmbox_cpu_slots_busy",
        "CPU slots in use, by calls (foreground) and by jobs and async executions (background).",
        Type::Gauge,
        classes(load.cpu_busy),
    );
    f.push(
        "wasmbox_cpu_slots_waiting",
        "Guests waiting for a CPU slot, by class.",
        Type::Gauge,
        classes(load.cpu_waiting),
    );
    f.one(
        "wasmbox_guests_live",
        "Guests alive now, computing or waiting in a sleep (at most WASMBOX_MAX_GUESTS).",
        gauge(load.guests_live),
    );
    f.one(
        "wasmbox_jobs_running",
        "Background jobs and async executions running.",
        gauge(load.jobs_running),
    );
    f.push(
        "wasmbox_queue_length",
        "Waiting now: calls for a guest place (guest), HTTP calls in their token's queue (token), async executions for a job place (async).",
        Type::Gauge,
        vec![
            labelled(&[("queue", "guest")], gauge(load.guests_waiting)),
            labelled(
                &[("queue", "token")],
                bytes(token_queue()),
            ),
            labelled(&[("queue", "async")], gauge(load.jobs_queued)),
        ],
    );

    f.one(
        "wasmbox_disk_used_bytes",
        "Bytes the sandboxes' /workspace and /tmp hold, as their disk budgets count them.",
        bytes(used),
    );
    f.one(
        "wasmbox_disk_quota_bytes",
        "The sandboxes' disk quotas, added up.",
        bytes(quota),
    );
    f.one(
        "wasmbox_snapshot_bytes",
        "Bytes the finished snapshots are charged, every owner's.",
        bytes(sandboxes.snapshots.charged_total()),
    );
    f
}

/// The figures as `get_system_metrics` carries them.
pub async fn json(wasmbox: &Wasmbox) -> serde_json::Map<String, serde_json::Value> {
    gather(wasmbox).await.to_json()
}

/// The content type of what [`Figures::encode`] writes: OpenMetrics text 1.0.0.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
