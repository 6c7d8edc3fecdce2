//! Settings, from flags and the environment (`WASMBOX_*`).

use std::path::PathBuf;
use std::time::Duration;

use crate::cloud::CloudConfig;
use crate::engine::disk::Quota;
use crate::engine::limits::Limits;
use crate::lang::image_runtime::PoolOptions;
use crate::lang::images::ImageBudget;
use crate::lang::mounts::MountSettings;
use crate::lang::python::{DEFAULT_PREIMPORT, PythonOptions};
use crate::sandbox::SandboxConfig;

/// Everything a [`crate::Wasmbox`] needs to know; [`Config::from_env`] gives the defaults.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where `wasmbox setup` (or `fetch-runtimes.sh`) put the runtimes.
    pub runtimes_dir: PathBuf,
    /// Where compiled modules are cached (outside the repo).
    pub cache_dir: PathBuf,
    /// Compiled modules no process has loaded for this long are removed after `prepare`
    /// (`None`: never).
    pub cache_max_age: Option<Duration>,
    /// Limits used when a call gives none.
    pub default_limits: Limits,
    /// The most a call may ask for.
    pub max_timeout: Duration,
    pub max_memory_bytes: usize,
    pub max_output_bytes: usize,
    /// Largest accepted code input (also a script `run_command` reads from the workspace).
    pub max_code_bytes: usize,
    /// Per-call budget for text a tool answers with (`file_read`, `file_list`, process lists): a
    /// guest's file or output must not flood the assistant's context (~4 bytes a token).
    pub result_bytes: usize,
    /// What a one-shot's fresh `/workspace` and `/tmp` may hold together.
    pub oneshot_quota: Quota,
    /// Most bytes of a file one `file_download` returns. Its base64 goes out twice (text and
    /// `structuredContent`) on one JSON-RPC line, and rmcp's stdio transport drops lines over
    /// 16 MiB (the call then never answers): 4 MiB makes an 11 MB line.
    pub download_bytes: usize,
    /// What one answer's images (a Python run's figures, a downloaded image) may take: a
    /// count and their base64 bytes together. They ride on the same JSON-RPC line as the text,
    /// so the bytes are held under 12 MiB. `None` (`WASMBOX_IMAGES=0`): no figures collected.
    pub images: Option<ImageBudget>,
    /// Guests that may execute wasm at once (CPU slots); a guest waiting in a sleep holds none.
    pub max_concurrency: usize,
    /// CPU slots background work (jobs, async executions) may never take, so that a plain
    /// call always finds one.
    pub foreground_slots: usize,
    /// Guests alive at once (computing or waiting): the guest threads' cap.
    pub max_guests: usize,
    /// How long a call may wait for a guest thread and a CPU slot before it is refused as busy;
    /// the call's own deadline starts only once it runs.
    pub queue_wait: Duration,
    /// Background jobs and async executions running at once, in all and per owner (token).
    pub max_jobs: usize,
    pub max_jobs_per_owner: usize,
    /// Sandbox-less async executions waiting for a job slot: how many, and their code's bytes.
    pub async_queue: usize,
    pub async_queue_bytes: usize,
    /// What Python's image pre-imports.
    pub python: PythonOptions,
    /// Ready instances kept per language (Python and JavaScript each have a pool this size).
    pub pool: PoolOptions,
    /// Instance slots of wasmtime's pooling allocator (0: allocate on demand). Must cover every
    /// live instance: ready pools, running executions and sessions.
    pub pooled_instances: u32,
    /// The HOPX cloud fallback (`HOPX_API_KEY`, `HOPX_BASE_URL`, `WASMBOX_OFFLINE`).
    pub cloud: CloudConfig,
    /// Persistent sandboxes: lifetimes, how many, quotas.
    pub sandbox: SandboxConfig,
    /// Async executions' webhooks.
    pub webhook: WebhookConfig,
    /// MCP sessions one `serve --http` token may hold open; each costs a session task and buffers.
    pub sessions_per_token: usize,
    /// What guests may reach through the host (`reach::ReachConfig::from_env`).
    pub reach: crate::reach::ReachConfig,
    /// The audit log's cap on one file (`WASMBOX_AUDIT_MB`, 64; three files are kept);
    /// `None` (`WASMBOX_AUDIT=0`): no audit log.
    pub audit_bytes: Option<u64>,
    /// A folder of `.whl` files installs look in first (`WASMBOX_WHEELHOUSE`).
    pub wheelhouse: Option<PathBuf>,
    /// The package index's base URL (`WASMBOX_PACKAGE_INDEX`; PyPI), asked unless offline.
    pub package_index: String,
    /// Host folders lent to guests (`WASMBOX_MOUNTS`, `WASMBOX_MOUNT_DISK_MB`,
    /// `WASMBOX_MOUNT_FILES`), as given: checked when they are lent at start.
    pub mounts: MountSettings,
}

/// Where async results may be POSTed, and the key that signs them.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Any http(s) host (`WASMBOX_WEBHOOK_ALLOW_ANY=1`); by default loopback hosts only.
    pub allow_any_host: bool,
    /// With `allow_any_host`, private, link-local (cloud metadata), CGNAT, unspecified and
    /// multicast addresses too (`WASMBOX_WEBHOOK_ALLOW_PRIVATE=1`): a webhook is a request the
    /// server makes from inside the user's network, so these need a second, explicit yes.
    pub allow_private: bool,
    /// HMAC-SHA256 key (`WASMBOX_WEBHOOK_SECRET`); `None`: a random one in the cache dir.
    pub secret: Option<String>,
}

pub const MIB: usize = 1 << 20;

impl Config {
    /// Defaults, overridden by `WASMBOX_RUNTIMES`, `WASMBOX_CACHE`,
    /// `WASMBOX_CACHE_MAX_AGE_DAYS` (0: keep every compiled module), `WASMBOX_MEMORY_MB`,
    /// `WASMBOX_OUTPUT_BYTES`, `WASMBOX_RESULT_BYTES` (a tool answer's text: 80,000),
    /// `WASMBOX_ONESHOT_DISK_MB` (a one-shot's `/workspace` and `/tmp` together: 256),
    /// `WASMBOX_DOWNLOAD_BYTES` (one `file_download`: 4 MiB), `WASMBOX_IMAGES` (figures a
    /// Python run returns as images: 4; 0: none), `WASMBOX_IMAGE_BYTES` (their base64 together:
    /// 6 MiB, at most 12 MiB), `WASMBOX_CONCURRENCY`,
    /// `WASMBOX_FOREGROUND_SLOTS`, `WASMBOX_MAX_GUESTS`, `WASMBOX_QUEUE_WAIT_S`,
    /// `WASMBOX_MAX_JOBS`, `WASMBOX_MAX_JOBS_PER_TOKEN`, `WASMBOX_ASYNC_QUEUE`,
    /// `WASMBOX_ASYNC_QUEUE_MB`, `WASMBOX_PYTHON_PREIMPORT` (comma-separated modules, or `none`
    /// for no pre-initialised image), `WASMBOX_POOL_SIZE`,
    /// `WASMBOX_POOL_MEMORY_MB`, `WASMBOX_POOL_REFILL_THREADS`, `WASMBOX_POOLED_INSTANCES` (0 turns the
    /// pooling allocator off), `WASMBOX_SANDBOX_TIMEOUT` (seconds), `WASMBOX_MAX_SANDBOXES`,
    /// `WASMBOX_SANDBOX_DISK_MB`, `WASMBOX_SANDBOX_FILES`, `WASMBOX_SANDBOX_JOBS`,
    /// `WASMBOX_MAX_SANDBOXES_PER_TOKEN`, `WASMBOX_SESSIONS_PER_TOKEN`, `WASMBOX_DATA`
    /// (sandboxes' files and saved sessions; `none`: a temporary directory, gone with the
    /// process), `WASMBOX_SAVE_EVERY_CALL`, `WASMBOX_IDLE_PAUSE_S` (0: idle sessions stay live),
    /// `WASMBOX_SNAPSHOT_DISK_MB` (per owner: snapshots and saved sessions), `WASMBOX_STATE_MB`
    /// (one session's saved state; default the memory limit), `WASMBOX_LIVE_SESSIONS` (in memory at once),
    /// `WASMBOX_WEBHOOK_ALLOW_ANY`, `WASMBOX_WEBHOOK_ALLOW_PRIVATE` (with ALLOW_ANY only),
    /// `WASMBOX_WEBHOOK_SECRET`, `WASMBOX_AUDIT` (0: no audit log), `WASMBOX_AUDIT_MB`,
    /// `WASMBOX_WHEELHOUSE`, `WASMBOX_PACKAGE_INDEX`, `WASMBOX_MOUNTS`, `WASMBOX_MOUNT_DISK_MB`,
    /// `WASMBOX_MOUNT_FILES`, and for the HOPX cloud (read by [`CloudConfig::from_env`])
    /// `HOPX_API_KEY`, `HOPX_BASE_URL`, `WASMBOX_OFFLINE`, `WASMBOX_MAX_CLOUD_SANDBOXES`,
    /// `WASMBOX_MAX_CLOUD_SANDBOXES_PER_TOKEN` and `WASMBOX_CLOUD_SANDBOX_MAX_TIMEOUT` (seconds).
    /// The Go runtime reads its own at load: `WASMBOX_GO`, `WASMBOX_GO_CACHE_MB`,
    /// `WASMBOX_GO_MAX_WASM_MB` (largest built program) and `WASMBOX_GOCACHE_MAX_AGE_DAYS` (GOCACHE
    /// trim; 0: left to Go).
    pub fn from_env() -> Self {
        let env_num = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
        };
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        let memory = env_num("WASMBOX_MEMORY_MB").map_or(1024 * MIB, |m| m * MIB);
        let output = env_num("WASMBOX_OUTPUT_BYTES").unwrap_or(MIB);
        let concurrency = env_num("WASMBOX_CONCURRENCY").unwrap_or(cores * 2).max(1);
        let max_jobs = env_num("WASMBOX_MAX_JOBS").unwrap_or(cores * 2).max(1);
        Config {
            runtimes_dir: std::env::var_os("WASMBOX_RUNTIMES")
                .map(PathBuf::from)
                .unwrap_or_else(default_runtimes_dir),
            cache_dir: std::env::var_os("WASMBOX_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(default_cache_dir),
            cache_max_age: match env_num("WASMBOX_CACHE_MAX_AGE_DAYS").unwrap_or(14) {
                0 => None,
                days => Some(Duration::from_secs(days as u64 * 86400)),
            },
            default_limits: Limits {
                timeout: Duration::from_secs(30),
                memory_bytes: memory,
                output_bytes: output,
            },
            max_timeout: Duration::from_secs(300),
            max_memory_bytes: memory.max(4096 * MIB),
            max_output_bytes: output.max(16 * MIB),
            max_code_bytes: 4 * MIB,
            result_bytes: env_num("WASMBOX_RESULT_BYTES").unwrap_or(80_000).max(1),
            oneshot_quota: Quota {
                max_bytes: env_num("WASMBOX_ONESHOT_DISK_MB").unwrap_or(256) as u64 * MIB as u64,
                max_entries: env_num("WASMBOX_SANDBOX_FILES").unwrap_or(10_000) as u64,
            },
            download_bytes: env_num("WASMBOX_DOWNLOAD_BYTES").unwrap_or(4 * MIB).max(1),
            images: ImageBudget::new(
                env_num("WASMBOX_IMAGES").unwrap_or(ImageBudget::DEFAULT.max_images),
                env_num("WASMBOX_IMAGE_BYTES").unwrap_or(ImageBudget::DEFAULT.max_base64_bytes),
            ),
            max_concurrency: concurrency,
            foreground_slots: env_num("WASMBOX_FOREGROUND_SLOTS")
                .unwrap_or((concurrency / 4).max(1)),
            max_guests: env_num("WASMBOX_MAX_GUESTS").unwrap_or(32).max(concurrency),
            queue_wait: Duration::from_secs_f64(
                std::env::var("WASMBOX_QUEUE_WAIT_S")
                    .ok()
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .unwrap_or(10.0),
            ),
            max_jobs,
            max_jobs_per_owner: env_num("WASMBOX_MAX_JOBS_PER_TOKEN")
                .unwrap_or(max_jobs / 2)
                .max(1),
            async_queue: env_num("WASMBOX_ASYNC_QUEUE").unwrap_or(16),
            async_queue_bytes: env_num("WASMBOX_ASYNC_QUEUE_MB").unwrap_or(16) * MIB,
            pooled_instances: env_num("WASMBOX_POOLED_INSTANCES").unwrap_or(256) as u32,
            cloud: CloudConfig::from_env(),
            sandbox: SandboxConfig {
                default_timeout: Duration::from_secs(
                    env_num("WASMBOX_SANDBOX_TIMEOUT").unwrap_or(600) as u64,
                ),
                max_timeout: Duration::from_secs(24 * 3600),
                max_live: env_num("WASMBOX_MAX_SANDBOXES").unwrap_or(32),
                quota: Quota {
                    max_bytes: env_num("WASMBOX_SANDBOX_DISK_MB").unwrap_or(512) as u64
                        * MIB as u64,
                    max_entries: env_num("WASMBOX_SANDBOX_FILES").unwrap_or(10_000) as u64,
                },
                max_running_jobs: env_num("WASMBOX_SANDBOX_JOBS").unwrap_or(4),
                max_kept_jobs: 64,
                max_per_owner: env_num("WASMBOX_MAX_SANDBOXES_PER_TOKEN")
                    .or_else(|| env_num("WASMBOX_MAX_SANDBOXES"))
                    .unwrap_or(32),
                data_dir: match std::env::var_os("WASMBOX_DATA") {
                    Some(v) if v == "none" => None,
                    Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
                    _ => Some(default_data_dir()),
                },
                save_every_call: env_num("WASMBOX_SAVE_EVERY_CALL").unwrap_or(0) != 0,
                save_idle: match env_num("WASMBOX_SAVE_IDLE_MS").unwrap_or(1000) {
                    0 => None,
                    ms => Some(Duration::from_millis(ms as u64)),
                },
                idle_pause: match env_num("WASMBOX_IDLE_PAUSE_S").unwrap_or(120) {
                    0 => None,
                    s => Some(Duration::from_secs(s as u64)),
                },
                snapshot_bytes: env_num("WASMBOX_SNAPSHOT_DISK_MB").unwrap_or(2048) as u64
                    * MIB as u64,
                max_state_bytes: env_num("WASMBOX_STATE_MB").map_or(memory, |m| m * MIB) as u64,
                max_live_sessions: live_sessions(
                    env_num("WASMBOX_LIVE_SESSIONS").unwrap_or(8),
                    env_num("WASMBOX_POOLED_INSTANCES").unwrap_or(256),
                ),
            },
            sessions_per_token: env_num("WASMBOX_SESSIONS_PER_TOKEN").unwrap_or(16).max(1),
            reach: crate::reach::ReachConfig::from_env(),
            audit_bytes: match std::env::var("WASMBOX_AUDIT").as_deref() {
                Ok("0") => None,
                _ => Some(env_num("WASMBOX_AUDIT_MB").unwrap_or(64).max(1) as u64 * MIB as u64),
            },
            wheelhouse: std::env::var_os("WASMBOX_WHEELHOUSE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            package_index: std::env::var("WASMBOX_PACKAGE_INDEX")
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "https://pypi.org".into()),
            mounts: MountSettings::from_env(),
            webhook: WebhookConfig {
                allow_any_host: std::env::var("WASMBOX_WEBHOOK_ALLOW_ANY").is_ok_and(|v| v == "1"),
                allow_private: std::env::var("WASMBOX_WEBHOOK_ALLOW_PRIVATE")
                    .is_ok_and(|v| v == "1"),
                secret: std::env::var("WASMBOX_WEBHOOK_SECRET")
                    .ok()
                    .filter(|s| !s.is_empty()),
            },
            python: PythonOptions {
                preimport: match std::env::var("WASMBOX_PYTHON_PREIMPORT") {
                    Ok(v) if v.trim() == "none" || v.trim().is_empty() => Vec::new(),
                    Ok(v) => v.split(',').map(|m| m.trim().to_string()).collect(),
                    Err(_) => DEFAULT_PREIMPORT.iter().map(|m| m.to_string()).collect(),
                },
            },
            pool: PoolOptions {
                size: pool_size(
                    env_num("WASMBOX_POOL_SIZE").unwrap_or(4),
                    env_num("WASMBOX_POOL_MEMORY_MB").unwrap_or(256),
                ),
                refill_threads: env_num("WASMBOX_POOL_REFILL_THREADS").unwrap_or(1).max(1),
            },
        }
    }
}

/// Ready instances idle at about 8-30 MiB each; the memory budget caps how many are kept.
/// Live sessions at most: as asked, within the pooling allocator's slots (half of its core
/// instances; pools, one-shots and jobs take the rest).
fn live_sessions(wanted: usize, pooled_instances: usize) -> usize {
    let wanted = wanted.max(1);
    if pooled_instances == 0 {
        wanted
    } else {
        wanted.min(pooled_instances)
    }
}

fn pool_size(wanted: usize, budget_mb: usize) -> usize {
    const PER_INSTANCE_MB: usize = 32;
    wanted.min(budget_mb / PER_INSTANCE_MB)
}

/// Where sandboxes' files live across restarts, e.g. `~/.local/share/wasmbox`.
fn default_data_dir() -> PathBuf {
    dirs::data_local_dir()
        .map(|d| d.join("wasmbox"))
        .unwrap_or_else(|| default_cache_dir().join("data"))
}

/// `./runtimes` when run from a checkout; else the user's runtimes (`wasmbox setup`) once they
/// hold something; else the checkout this binary was built from when it has runtimes; else the
/// user's (empty: the errors then say to run `wasmbox setup`).
fn default_runtimes_dir() -> PathBuf {
    if let Some(here) = checkout_runtimes_dir() {
        return here;
    }
    let user = user_runtimes_dir();
    if user.join(".verified.json").is_file() {
        return user;
    }
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("runtimes");
    if built.join(".verified.json").is_file() {
        return built;
    }
    user
}

/// `./runtimes` when the working directory is a wasmbox checkout.
pub fn checkout_runtimes_dir() -> Option<PathBuf> {
    let here = PathBuf::from("runtimes");
    here.join("manifest.toml").is_file().then_some(here)
}

/// Where `wasmbox setup` puts runtimes outside a checkout.
pub fn user_runtimes_dir() -> PathBuf {
    dirs::data_local_dir()
        .map(|d| d.join("wasmbox").join("runtimes"))
        .unwrap_or_else(|| default_cache_dir().join("runtimes"))
}

fn default_cache_dir() -> PathBuf {
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("wasmbox")
}
