//! `wasmbox setup`: the pinned runtimes fetched into the runtimes directory; and what `serve`
//! and `run` use when they set themselves up.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use wasmbox::Config;

use super::Start;

// The flags of `setup` (its help is `Command::Setup`'s doc comment).
#[derive(clap::Args)]
pub struct Args {
    /// Only these runtimes (comma-separated: python, quickjs, go).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Hash every installed file again, even when its stamp says it is unchanged.
    #[arg(long)]
    verify: bool,
    /// A runtimes manifest to use instead of the one built in (for moving a pin).
    #[arg(long, value_name = "FILE")]
    manifest: Option<PathBuf>,
}

pub(super) async fn setup(args: Args, start: Start) -> anyhow::Result<ExitCode> {
    let Args {
        only,
        verify,
        manifest,
    } = args;
    let manifest = match manifest {
        Some(m) => {
            Some(std::fs::read_to_string(&m).with_context(|| format!("reading {}", m.display()))?)
        }
        None => None,
    };
    wasmbox::setup::run(wasmbox::setup::Options {
        only,
        verify,
        manifest,
        ..options(start.setup_dir, &start.config)
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// The runtimes a binary sets up by itself, by setup name, and the file that says each is there.
pub(super) const SET_UP: [(&str, &str); 2] = [
    ("python", "python/python-snapshot.wasm"),
    ("quickjs", "quickjs/qjs.wasm"),
];

/// Every runtime into `dir`, with the server's cache and package index; crates (QuickJS-NG's
/// sources) from `WASMBOX_CRATES_URL`.
pub(super) fn options(dir: PathBuf, config: &Config) -> wasmbox::setup::Options {
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
