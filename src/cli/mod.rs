//! The command line: the flags every subcommand shares, the list of subcommands, and what they
//! all start from. Each subcommand, its own flags and its work are in its file.

mod prepare;
mod run;
mod serve;
mod setup;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use wasmbox::Config;
use wasmbox::lang::mounts::{Layout, MountSettings};

#[derive(Parser)]
#[command(
    name = "wasmbox",
    version,
    about = "Local WebAssembly code sandbox for AI assistants (MCP server)"
)]
pub struct Cli {
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

// A subcommand's help is its variant's doc comment; its flags are its `Args`' (which carry no
// doc comment of their own, so that the variant's is the only one).
#[derive(Subcommand)]
enum Command {
    /// Serve MCP over stdio (what Claude Desktop, Cursor and VS Code start), or over streamable
    /// HTTP with --http.
    Serve(serve::Args),
    /// Run code once in a fresh sandbox; prints its output and exits with its exit code.
    Run(run::Args),
    /// Compile every available runtime now (first time: a minute or more) so later starts are fast.
    Prepare,
    /// Fetch the pinned runtimes (Python, the JavaScript runtime's sources and compiler, Go)
    /// into the runtimes directory (default: ~/.local/share/wasmbox/runtimes outside a
    /// checkout), each checked against its pinned SHA-256. Needs only this binary; a second run
    /// with everything present does no network I/O.
    Setup(setup::Args),
}

/// What every subcommand starts from.
struct Start {
    /// The environment's settings with the global flags over them.
    config: Config,
    /// Where setup puts runtimes: the named directory, a checkout's, or the user's; never the
    /// checkout this binary was built from, which serving falls back to.
    setup_dir: PathBuf,
    /// Whether --runtimes (or WASMBOX_RUNTIMES) named the runtimes directory.
    runtimes_named: bool,
    /// The folders --mount lends.
    mounts: Vec<String>,
}

/// Runs the command line's subcommand; the exit code is its answer.
pub async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let Cli {
        runtimes,
        cache_dir,
        data_dir,
        offline,
        mounts,
        command,
    } = cli;
    let mut config = Config::from_env();
    let setup_dir = runtimes.clone().unwrap_or_else(|| {
        wasmbox::config::checkout_runtimes_dir().unwrap_or_else(wasmbox::config::user_runtimes_dir)
    });
    let runtimes_named = runtimes.is_some();
    if let Some(r) = runtimes {
        config.runtimes_dir = r;
    }
    config.cloud.offline |= offline;
    if let Some(c) = cache_dir {
        config.cache_dir = c;
    }
    if let Some(d) = data_dir {
        config.sandbox.data_dir = (d.as_os_str() != "none").then_some(d);
    }
    let start = Start {
        config,
        setup_dir,
        runtimes_named,
        mounts,
    };
    match command {
        Command::Serve(args) => serve::serve(args, start).await,
        Command::Run(args) => run::run(args, start).await,
        Command::Prepare => prepare::prepare(start).await,
        Command::Setup(args) => setup::setup(args, start).await,
    }
}

/// Lends the folders of --mount and WASMBOX_MOUNTS to the local user's sandboxes; answers
/// WASMBOX_TOKEN_MOUNTS, the folders `serve --http` lends each token.
fn lend_folders(
    settings: &MountSettings,
    mounts: &[String],
    over_http: bool,
) -> anyhow::Result<Option<String>> {
    let layout = Layout::from_settings(settings, mounts).map_err(anyhow::Error::msg)?;
    // Lent folders are the local user's: an HTTP token's code sees only its own
    // (WASMBOX_TOKEN_MOUNTS).
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
    Ok(token_mounts)
}
