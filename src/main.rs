//! The `wasmbox` command: `serve` (MCP over stdio or HTTP), `run` (one execution), `prepare`
//! (compile every runtime ahead of time), `setup` (fetch the runtimes). `cli/` holds each.

mod cli;

use std::process::ExitCode;

use clap::Parser;

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
    let cli = cli::Cli::parse();
    // Logs to stderr (stdout is the MCP protocol's in `serve`), spans over OTLP when asked.
    let telemetry = wasmbox::telemetry::trace::init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let outcome = runtime.block_on(cli::dispatch(cli));
    // Not a plain drop: that would wait for blocking tasks, such as the stdin reader (stdin not
    // a pipe) of a server told to stop by SIGTERM while its client is still connected.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    // The spans of the last calls are still queued for the exporter.
    telemetry.shutdown();
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("wasmbox: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
