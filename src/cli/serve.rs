//! `wasmbox serve`: MCP over stdio, or over streamable HTTP with --http. A binary with no
//! runtimes yet fetches them in the background meanwhile.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use wasmbox::{Config, Wasmbox};

use super::Start;
use super::setup::{SET_UP, options};

// The flags of `serve` (its help is `Command::Serve`'s doc comment).
#[derive(clap::Args)]
pub struct Args {
    /// Serve MCP's streamable HTTP transport at http://ADDR/mcp instead of stdio, e.g.
    /// 127.0.0.1:8765. Every request needs `Authorization: Bearer <token>`: WASMBOX_TOKEN
    /// (comma-separated for several clients), or a token generated and printed on first start.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
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
}

pub(super) async fn serve(args: Args, start: Start) -> anyhow::Result<ExitCode> {
    let Start {
        mut config,
        runtimes_named,
        mounts,
        ..
    } = start;
    if let Some(path) = &args.mcp_config {
        config.reach.mcp_config = Some(path.clone());
    }
    let token_mounts = super::lend_folders(&config.mounts, &mounts, args.http.is_some())?;
    auto_setup(&config, runtimes_named);
    let wasmbox = Wasmbox::new(config)?;
    match args.http {
        None => wasmbox::mcp::serve::serve_stdio(wasmbox).await?,
        Some(addr) => serve_http(wasmbox, addr, args, token_mounts).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// A binary installed without a checkout (a bundle, a wheel, cargo install) sets itself up on
/// its first start, in the background: the server answers at once, and a call that needs a
/// runtime not there yet says so (the next one loads it).
fn auto_setup(config: &Config, runtimes_named: bool) {
    let auto_setup = !runtimes_named
        && config.runtimes_dir == wasmbox::config::user_runtimes_dir()
        && SET_UP
            .iter()
            .any(|(_, f)| !config.runtimes_dir.join(f).is_file())
        && std::env::var("WASMBOX_AUTO_SETUP").as_deref() != Ok("0");
    if !auto_setup {
        return;
    }
    let opts = options(config.runtimes_dir.clone(), config);
    // The target is the binary's, as when these lines were in main.rs: the same log lines.
    tracing::info!(
        target: "wasmbox",
        "no runtimes yet: fetching them into {} (wasmbox setup; WASMBOX_AUTO_SETUP=0 turns this off)",
        opts.dir.display()
    );
    tokio::spawn(async move {
        match wasmbox::setup::run(opts).await {
            Ok(()) => tracing::info!(target: "wasmbox", "runtimes ready"),
            Err(e) => {
                tracing::error!(target: "wasmbox", "setting up the runtimes: {e:#}; run `wasmbox setup`")
            }
        }
    });
}

/// Serves at `addr` to the bearer tokens, lending each its folders of WASMBOX_TOKEN_MOUNTS.
async fn serve_http(
    wasmbox: Wasmbox,
    addr: SocketAddr,
    args: Args,
    token_mounts: Option<String>,
) -> anyhow::Result<()> {
    let dir = config_dir(&wasmbox);
    let calls_per_token = args
        .calls_per_token
        .unwrap_or(wasmbox.config().max_concurrency)
        .max(1);
    let tokens = tokens(&dir)?;
    if let Some(spec) = token_mounts {
        let layouts = wasmbox::lang::mounts::token_layouts(
            &spec,
            &tokens,
            wasmbox::mcp::serve::token_owner,
            &wasmbox.config().mounts,
        )
        .map_err(anyhow::Error::msg)?;
        wasmbox::lang::mounts::set_token_layouts(layouts).map_err(anyhow::Error::msg)?;
    }
    wasmbox::mcp::serve::serve_http(
        wasmbox,
        wasmbox::mcp::serve::HttpOptions {
            addr,
            allow_remote: args.allow_remote,
            tokens,
            calls_per_token,
            queue_per_token: args.queue_per_token,
        },
    )
    .await
}

/// The HTTP bearer tokens: WASMBOX_TOKEN's, else the one saved in `dir` (generated on the
/// first start, and said where on stderr).
fn tokens(dir: &Path) -> anyhow::Result<Vec<String>> {
    let from_env = std::env::var("WASMBOX_TOKEN").ok();
    let chosen = from_env.is_some();
    let (tokens, generated) = wasmbox::mcp::serve::http_tokens(from_env, dir)?;
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
    Ok(tokens)
}

/// Where the generated HTTP token lives: the data directory, else the cache directory.
fn config_dir(wasmbox: &Wasmbox) -> PathBuf {
    let c = wasmbox.config();
    c.sandbox
        .data_dir
        .clone()
        .unwrap_or_else(|| c.cache_dir.clone())
}
