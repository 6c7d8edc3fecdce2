//! The `wasmbox` command: `serve` (MCP over stdio), `run` (one execution), `prepare` (compile
//! every runtime ahead of time).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use wasmbox::{Config, ExecOptions, Wasmbox};

#[derive(Parser)]
#[command(
    name = "wasmbox",
    version,
    about = "Local WebAssembly code sandbox for AI assistants (MCP server)"
)]
struct Cli {
    /// Runtimes directory (default: ./runtimes in a checkout, else the one `wasmbox setup`
    /// filled, e.g. ~/.local/share/wasmbox/runtimes, else the checkout wasmbox was built from).
    #[arg(long, global = true, env = "WASMBOX_RUNTIMES")]
    runtimes: Option<PathBuf>,
    /// Compiled-module cache directory (default: the user cache dir, e.g. ~/.cache/wasmbox).
    #[arg(long, global = true, env = "WASMBOX_CACHE")]
    cache_dir: Option<PathBuf>,
    /// Where persistent sandboxes keep their files across restarts (default: the user data dir,
    /// e.g. ~/.local/share/wasmbox; `none`: a temporary directory gone with the process).
    #[arg(long, global = true, env = "WASMBOX_DATA")]
    data_dir: Option<PathBuf>,
    /// Never use the HOPX cloud fallback (also WASMBOX_OFFLINE=1): bash, shell commands,
    /// internet access and cloud-only templates then fail with an error.
    #[arg(long, global = true)]
    offline: bool,
    /// Lend a host folder to every sandbox: HOST_DIR:GUEST_PATH[:ro|rw], the guest path /data,
    /// /mnt or one folder below them; read-only unless `rw`. Repeatable; WASMBOX_MOUNTS takes
    /// the same, comma-separated.
    #[arg(long = "mount", global = true, value_name = "HOST:GUEST[:ro|rw]")]
    mounts: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve MCP over stdio (what Claude Desktop, Cursor and VS Code start), or over streamable
    /// HTTP with --http.
    Serve {
        /// Serve MCP's streamable HTTP transport at http://ADDR/mcp instead of stdio, e.g.
        /// 127.0.0.1:8765. Every request needs `Authorization: Bearer <token>`: WASMBOX_TOKEN
        /// (comma-separated for several clients), or a token generated and printed on first start.
        #[arg(long, value_name = "ADDR")]
        http: Option<std::net::SocketAddr>,
        /// Allow --http on a non-loopback address.
        #[arg(long, requires = "http")]
        allow_remote: bool,
        /// Tool calls one token may have running at once [default: the CPU slots: a token
        /// alone may use them all; while another token waits, the CPU scheduler gives it turns].
        #[arg(long, env = "WASMBOX_TOKEN_CONCURRENCY")]
        calls_per_token: Option<usize>,
        /// Tool calls one token may have waiting for one of its running places; past it a call
        /// is refused, saying so.
        #[arg(long, env = "WASMBOX_TOKEN_QUEUE", default_value_t = 64)]
        queue_per_token: usize,
        /// An `mcpServers` file (Claude Desktop's form) whose servers' tools code may call:
        /// `from wasmbox import tools` in Python, `tools` in JavaScript (stdio only).
        #[arg(long, value_name = "FILE", env = "WASMBOX_MCP_CONFIG")]
        mcp_config: Option<PathBuf>,
    },
    /// Run code once in a fresh sandbox; prints its output and exits with its exit code.
    Run {
        /// python, javascript (js, node) or go (golang); bash is not available in this build yet.
        #[arg(long, short, default_value = "python")]
        language: String,
        /// The code; `-` reads it from stdin.
        #[arg(long, short, conflicts_with = "file")]
        code: Option<String>,
        /// Read the code from a file.
        #[arg(long, short)]
        file: Option<PathBuf>,
        /// Deadline in seconds (default 30, max 300).
        #[arg(long, short)]
        timeout: Option<f64>,
        /// Linear-memory cap in MiB (default 1024).
        #[arg(long)]
        memory_mb: Option<u64>,
        /// Environment variable for the guest, KEY=VALUE (repeatable).
        #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// Print the result object as JSON instead of the guest's output.
        #[arg(long)]
        json: bool,
    },
    /// Compile every available runtime now (first time: a minute or more) so later starts are fast.
    Prepare,
    /// Fetch the pinned runtimes (Python, the JavaScript runtime's sources and compiler, Go)
    /// into the runtimes directory (default: ~/.local/share/wasmbox/runtimes outside a
    /// checkout), each checked against its pinned SHA-256. Needs only this binary; a second run
    /// with everything present does no network I/O.
    Setup {
        /// Only these runtimes (comma-separated: python, quickjs, go).
        #[arg(long, value_delimiter = ',')]
        only: Option<Vec<String>>,
        /// Hash every installed file again, even when its stamp says it is unchanged.
        #[arg(long)]
        verify: bool,
        /// A runtimes manifest to use instead of the one built in (for moving a pin).
        #[arg(long, value_name = "FILE")]
        manifest: Option<PathBuf>,
    },
}

/// Settings an MCP bundle passes as empty strings when the user left them blank.
const BLANK_MEANS_UNSET: &[&str] = &[
    "HOPX_API_KEY",
    "WASMBOX_DATA",
    "WASMBOX_MOUNTS",
    "WASMBOX_ALLOW_HOSTS",
    "WASMBOX_WHEELHOUSE",
    "WASMBOX_RUNTIMES",
];

fn main() -> ExitCode {
    for k in BLANK_MEANS_UNSET {
        if std::env::var_os(k).is_some_and(|v| v.is_empty()) {
            // SAFETY: no other thread exists yet (the runtime and the logger start below).
            unsafe { std::env::remove_var(k) };
        }
    }
    let cli = Cli::parse();
    // info shows the one-time compile progress; nothing else logs at info outside `serve`.
    let default_level = "info";
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(format!("wasmbox={default_level}"))
            }),
        )
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let outcome = runtime.block_on(real_main(cli));
    // Not a plain drop: that would wait for blocking tasks, such as the stdin reader (stdin not
    // a pipe) of a server told to stop by SIGTERM while its client is still connected.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("wasmbox: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut config = Config::from_env();
    // Setup fills the named directory, a checkout's, or the user's: never the checkout this
    // binary was built from, which serving falls back to.
    let setup_dir = cli.runtimes.clone().unwrap_or_else(|| {
        wasmbox::config::checkout_runtimes_dir().unwrap_or_else(wasmbox::config::user_runtimes_dir)
    });
    let explicit_runtimes = cli.runtimes.clone();
    if let Some(r) = cli.runtimes {
        config.runtimes_dir = r;
    }
    config.cloud.offline |= cli.offline;
    if let Some(c) = cli.cache_dir {
        config.cache_dir = c;
    }
    if let Some(d) = cli.data_dir {
        config.sandbox.data_dir = (d.as_os_str() != "none").then_some(d);
    }
    if let Command::Serve {
        mcp_config: Some(path),
        ..
    } = &cli.command
    {
        config.reach.mcp_config = Some(path.clone());
    }
    if let Command::Setup {
        only,
        verify,
        manifest,
    } = cli.command
    {
        let manifest = match manifest {
            Some(m) => Some(
                std::fs::read_to_string(&m).with_context(|| format!("reading {}", m.display()))?,
            ),
            None => None,
        };
        wasmbox::setup::run(wasmbox::setup::Options {
            only,
            verify,
            manifest,
            ..setup_options(setup_dir, &config)
        })
        .await?;
        return Ok(ExitCode::SUCCESS);
    }
    let layout =
        wasmbox::lang::mounts::Layout::from_settings(&cli.mounts).map_err(anyhow::Error::msg)?;
    // Lent folders are the local user's: an HTTP token's code sees only its own
    // (WASMBOX_TOKEN_MOUNTS).
    let over_http = matches!(cli.command, Command::Serve { http: Some(_), .. });
    if !layout.mounts.is_empty() && over_http {
        anyhow::bail!(
            "WASMBOX_MOUNTS/--mount lend folders to the local user over stdio; over HTTP, lend each token its own with WASMBOX_TOKEN_MOUNTS"
        );
    }
    let token_mounts = std::env::var("WASMBOX_TOKEN_MOUNTS").ok();
    if token_mounts.is_some() && !over_http {
        anyhow::bail!(
            "WASMBOX_TOKEN_MOUNTS lends folders to HTTP tokens (serve --http); over stdio use WASMBOX_MOUNTS"
        );
    }
    wasmbox::lang::mounts::set_server_layout(layout).map_err(anyhow::Error::msg)?;
    // A binary installed without a checkout (a bundle, a wheel, cargo install) sets itself up
    // on its first start, in the background: the server answers at once, and a call that needs
    // a runtime not there yet says so (the next one loads it).
    let auto_setup = matches!(cli.command, Command::Serve { .. })
        && explicit_runtimes.is_none()
        && config.runtimes_dir == wasmbox::config::user_runtimes_dir()
        && SET_UP
            .iter()
            .any(|(_, f)| !config.runtimes_dir.join(f).is_file())
        && std::env::var("WASMBOX_AUTO_SETUP").as_deref() != Ok("0");
    if auto_setup {
        let opts = setup_options(config.runtimes_dir.clone(), &config);
        tracing::info!(
            "no runtimes yet: fetching them into {} (wasmbox setup; WASMBOX_AUTO_SETUP=0 turns this off)",
            opts.dir.display()
        );
        tokio::spawn(async move {
            match wasmbox::setup::run(opts).await {
                Ok(()) => tracing::info!("runtimes ready"),
                Err(e) => tracing::error!("setting up the runtimes: {e:#}; run `wasmbox setup`"),
            }
        });
    }
    // `run` with its language's runtime missing sets up that one alone, in the foreground, into
    // the checkout's or the user's folder: the answer comes before the others are fetched
    // (`wasmbox setup`, or a `serve`, fetches them). A folder the user named is left as named.
    let named = explicit_runtimes.is_some() || std::env::var_os("WASMBOX_RUNTIMES").is_some();
    if let Command::Run { language, .. } = &cli.command
        && !named
        && std::env::var("WASMBOX_AUTO_SETUP").as_deref() != Ok("0")
        && let Some((name, file)) = runtime_of(language)
        && !config.runtimes_dir.join(file).is_file()
    {
        let dir = setup_dir.clone();
        eprintln!(
            "wasmbox: no {name} runtime yet: fetching it alone into {} (the others: `wasmbox setup`; WASMBOX_AUTO_SETUP=0 turns this off)",
            dir.display()
        );
        wasmbox::setup::run(wasmbox::setup::Options {
            only: Some(vec![name.to_string()]),
            ..setup_options(dir.clone(), &config)
        })
        .await?;
        config.runtimes_dir = dir;
    }
    let wasmbox = Wasmbox::new(config)?;
    match cli.command {
        Command::Serve { http: None, .. } => {
            wasmbox::mcp::serve::serve_stdio(wasmbox).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve {
            http: Some(addr),
            allow_remote,
            calls_per_token,
            queue_per_token,
            ..
        } => {
            let dir = config_dir(&wasmbox);
            let calls_per_token = calls_per_token
                .unwrap_or(wasmbox.config().max_concurrency)
                .max(1);
            let from_env = std::env::var("WASMBOX_TOKEN").ok();
            let chosen = from_env.is_some();
            let (tokens, generated) = wasmbox::mcp::serve::http_tokens(from_env, &dir)?;
            match generated {
                Some(path) => eprintln!(
                    "wasmbox: generated an HTTP bearer token (saved in {}; set WASMBOX_TOKEN to choose your own):\n  {}",
                    path.display(),
                    tokens[0]
                ),
                None if !chosen => eprintln!(
                    "wasmbox: HTTP bearer token in {}",
                    dir.join("http-token").display()
                ),
                None => {}
            }
            if let Some(spec) = token_mounts {
                let layouts = wasmbox::lang::mounts::token_layouts(
                    &spec,
                    &tokens,
                    wasmbox::mcp::serve::token_owner,
                )
                .map_err(anyhow::Error::msg)?;
                wasmbox::lang::mounts::set_token_layouts(layouts).map_err(anyhow::Error::msg)?;
            }
            wasmbox::mcp::serve::serve_http(
                wasmbox,
                wasmbox::mcp::serve::HttpOptions {
                    addr,
                    allow_remote,
                    tokens,
                    calls_per_token,
                    queue_per_token,
                },
            )
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Setup { .. } => unreachable!("setup returns before the service starts"),
        Command::Prepare => {
            let mut failed = false;
            for (lang, outcome) in wasmbox.prepare().await {
                match outcome {
                    Ok((origin, took)) => eprintln!(
                        "{}: {} in {:.1} s (cache: {})",
                        lang.as_str(),
                        match origin {
                            wasmbox::engine::cache::Origin::Cached => "loaded from cache",
                            wasmbox::engine::cache::Origin::Compiled => "compiled",
                        },
                        took.as_secs_f64(),
                        wasmbox.config().cache_dir.display()
                    ),
                    Err(e) => {
                        failed = true;
                        eprintln!("{}: not ready: {e}", lang.as_str());
                    }
                }
            }
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Run {
            language,
            code,
            file,
            timeout,
            memory_mb,
            env,
            json,
        } => {
            let code = match (code, file) {
                (Some(c), _) if c == "-" => {
                    let mut s = String::new();
                    std::io::stdin()
                        .read_to_string(&mut s)
                        .context("reading code from stdin")?;
                    s
                }
                (Some(c), _) => c,
                (None, Some(f)) => std::fs::read_to_string(&f)
                    .with_context(|| format!("reading {}", f.display()))?,
                (None, None) => {
                    bail!("give the code with --code '...' (or --code - for stdin) or --file PATH")
                }
            };
            let mut env_map = BTreeMap::new();
            for kv in env {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--env {kv:?}: expected KEY=VALUE"))?;
                env_map.insert(k.to_string(), v.to_string());
            }
            let req = wasmbox.request(ExecOptions {
                language,
                code,
                env: env_map,
                timeout_secs: timeout,
                memory_mb,
                ..Default::default()
            })?;
            let result = wasmbox.execute(req).await?;
            // A closed stdout (e.g. piped into `head`) is not an error worth a panic.
            use std::io::Write;
            let _ = if json {
                // The answer a tool would give: within WASMBOX_RESULT_BYTES.
                let mut v = serde_json::to_value(&result)?;
                if wasmbox::fit::fit_value(&mut v, wasmbox.config().result_bytes) {
                    v["truncated"] = serde_json::json!(true);
                }
                let text = serde_json::to_string_pretty(&v)? + "\n";
                std::io::stdout().write_all(text.as_bytes())
            } else {
                std::io::stdout()
                    .write_all(result.stdout.as_bytes())
                    .and_then(|()| std::io::stderr().write_all(result.stderr.as_bytes()))
            };
            Ok(ExitCode::from(result.exit_code.clamp(0, 255) as u8))
        }
    }
}

/// The setup name of a language's runtime and the file that says it is there; `None` for
/// languages setup does not provide (a Go on PATH, bash in the cloud).
fn runtime_of(language: &str) -> Option<(&'static str, &'static str)> {
    match wasmbox::lang::Language::parse(language).ok()? {
        wasmbox::lang::Language::Python => Some(SET_UP[0]),
        wasmbox::lang::Language::JavaScript => Some(SET_UP[1]),
        _ => None,
    }
}

/// The runtimes a binary sets up by itself, by setup name, and the file that says each is there.
const SET_UP: [(&str, &str); 2] = [
    ("python", "python/python-snapshot.wasm"),
    ("quickjs", "quickjs/qjs.wasm"),
];

/// Where the generated HTTP token lives: the data directory, else the cache directory.
fn config_dir(wasmbox: &Wasmbox) -> PathBuf {
    let c = wasmbox.config();
    c.sandbox
        .data_dir
        .clone()
        .unwrap_or_else(|| c.cache_dir.clone())
}

/// Every runtime into `dir`, with the server's cache and package index; crates (QuickJS-NG's
/// sources) from `WASMBOX_CRATES_URL`.
fn setup_options(dir: PathBuf, config: &Config) -> wasmbox::setup::Options {
    wasmbox::setup::Options {
        dir,
        cache: config.cache_dir.clone(),
        only: None,
        verify: false,
        manifest: None,
        index: config.package_index.clone(),
        crates: std::env::var("WASMBOX_CRATES_URL")
            .unwrap_or_else(|_| "https://static.crates.io/crates".into()),
    }
}
