//! `wasmbox run`: code run once in a fresh sandbox, its output printed and its exit code ours.
//! A language whose runtime is missing has it fetched first, alone.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use wasmbox::{Config, ExecOptions, ExecResult, OneShot, Wasmbox};

use super::Start;
use super::setup::{SET_UP, options};

// The flags of `run` (its help is `Command::Run`'s doc comment).
#[derive(clap::Args)]
pub struct Args {
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
}

pub(super) async fn run(args: Args, start: Start) -> anyhow::Result<ExitCode> {
    let Start {
        mut config,
        setup_dir,
        runtimes_named,
        mounts,
    } = start;
    super::lend_folders(&config.mounts, &mounts, false)?;
    set_up_language(&args.language, &mut config, setup_dir, runtimes_named).await?;
    let wasmbox = Wasmbox::new(config)?;
    let code = code(args.code, args.file)?;
    let env = env(args.env)?;
    let opts = ExecOptions {
        language: args.language,
        code,
        env,
        timeout_secs: args.timeout,
        memory_mb: args.memory_mb,
        ..Default::default()
    };
    let (result, _) = wasmbox.oneshot(opts, OneShot::default()).await?;
    print(&wasmbox, &result, args.json)?;
    Ok(ExitCode::from(result.exit_code.clamp(0, 255) as u8))
}

/// `run` with its language's runtime missing sets up that one alone, in the foreground, into
/// the checkout's or the user's folder: the answer comes before the others are fetched
/// (`wasmbox setup`, or a `serve`, fetches them). A folder the user named is left as named.
async fn set_up_language(
    language: &str,
    config: &mut Config,
    setup_dir: PathBuf,
    runtimes_named: bool,
) -> anyhow::Result<()> {
    let named = runtimes_named || std::env::var_os("WASMBOX_RUNTIMES").is_some();
    if !named
        && std::env::var("WASMBOX_AUTO_SETUP").as_deref() != Ok("0")
        && let Some((name, file)) = runtime_of(language)
        && !config.runtimes_dir.join(file).is_file()
    {
        eprintln!(
            "wasmbox: no {name} runtime yet: fetching it alone into {} (the others: `wasmbox setup`; WASMBOX_AUTO_SETUP=0 turns this off)",
            setup_dir.display()
        );
        wasmbox::setup::run(wasmbox::setup::Options {
            only: Some(vec![name.to_string()]),
            ..options(setup_dir.clone(), config)
        })
        .await?;
        config.runtimes_dir = setup_dir;
    }
    Ok(())
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

/// The code to run: --code's, stdin's for `--code -`, or --file's.
fn code(code: Option<String>, file: Option<PathBuf>) -> anyhow::Result<String> {
    Ok(match (code, file) {
        (Some(c), _) if c == "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading code from stdin")?;
            s
        }
        (Some(c), _) => c,
        (None, Some(f)) => {
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?
        }
        (None, None) => {
            bail!("give the code with --code '...' (or --code - for stdin) or --file PATH")
        }
    })
}

/// The guest's environment from --env's KEY=VALUE pairs.
fn env(pairs: Vec<String>) -> anyhow::Result<BTreeMap<String, String>> {
    let mut env_map = BTreeMap::new();
    for kv in pairs {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--env {kv:?}: expected KEY=VALUE"))?;
        env_map.insert(k.to_string(), v.to_string());
    }
    Ok(env_map)
}

/// The guest's stdout and stderr on ours; with --json, the answer a tool would give on stdout.
fn print(wasmbox: &Wasmbox, result: &ExecResult, json: bool) -> anyhow::Result<()> {
    // A closed stdout (e.g. piped into `head`) is not an error worth a panic.
    let _ = if json {
        // The answer a tool would give: within WASMBOX_RESULT_BYTES.
        let mut v = serde_json::to_value(result)?;
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
    Ok(())
}
