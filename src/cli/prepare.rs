//! `wasmbox prepare`: every runtime compiled now (or loaded from the cache), each one's outcome
//! on stderr; fails if any is not ready.

use std::process::ExitCode;

use wasmbox::Wasmbox;
use wasmbox::engine::cache::Origin;

use super::Start;

pub(super) async fn prepare(start: Start) -> anyhow::Result<ExitCode> {
    super::lend_folders(&start.config.mounts, &start.mounts, false)?;
    let wasmbox = Wasmbox::new(start.config)?;
    let mut failed = false;
    for (lang, outcome) in wasmbox.prepare().await {
        match outcome {
            Ok((origin, took)) => eprintln!(
                "{}: {} in {:.1} s (cache: {})",
                lang.as_str(),
                match origin {
                    Origin::Cached => "loaded from cache",
                    Origin::Compiled => "compiled",
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
