//! The store: wheels kept by hash in `<cache>/wheels`, each unpacked once into a read-only tree
//! of `<cache>/packages`, staged, compiled and renamed into place whole.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use cap_std::fs::Dir;
use pep508_rs::pep440_rs::{Version, VersionSpecifiers};
use sha2::{Digest, Sha256};

use super::resolver::{Chosen, allowed};
use super::wheel::{self, normalize};
use super::{Compile, Installed, PackageError, Packages, index};
use crate::lang::python::{PACKAGES_GUEST, PackageTree};

impl Packages {
    /// A tree unpacked before from this index whose version matches: the newest. (An index's
    /// file never changes under its name; a wheelhouse's may, and another index's may differ,
    /// so those are read each time.)
    pub(super) fn unpacked(
        &self,
        name: &str,
        spec: &VersionSpecifiers,
    ) -> Result<Option<(Installed, Vec<String>)>, PackageError> {
        let mut best: Option<(Version, String)> = None;
        for e in std::fs::read_dir(&self.store)? {
            let tree = e?.file_name().to_string_lossy().into_owned();
            let mut parts = tree.rsplitn(3, '-');
            let (Some(_sha), Some(v), Some(dist)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if dist.starts_with('.') || normalize(dist) != name {
                continue;
            }
            let Ok(v) = Version::from_str(v) else {
                continue;
            };
            if !allowed(&v, spec) || best.as_ref().is_some_and(|(b, _)| *b >= v) {
                continue;
            }
            let from = self.tree_source(&tree).2;
            if self.index.as_ref().is_none_or(|i| from != i.base) {
                continue;
            }
            best = Some((v, tree));
        }
        let Some((_, tree)) = best else {
            return Ok(None);
        };
        let meta = self.tree_metadata(&tree)?;
        let (sha, wheel, _) = self.tree_source(&tree);
        Ok(Some((
            Installed {
                name: meta.name.clone(),
                version: meta.version.clone(),
                source: "index",
                wheel,
                sha256: sha,
                cached: true,
                tree: PackageTree {
                    name: meta.name,
                    version: meta.version,
                    tree,
                },
            },
            meta.requires,
        )))
    }

    pub(super) fn tree_metadata(&self, tree: &str) -> Result<wheel::Metadata, PackageError> {
        let root = self.store.join(tree);
        for e in std::fs::read_dir(&root)? {
            let n = e?.file_name();
            if n.to_string_lossy().ends_with(".dist-info") {
                let text = std::fs::read_to_string(root.join(&n).join("METADATA"))?;
                return wheel::parse_metadata(&text).ok_or_else(|| {
                    PackageError::Io(format!("{tree}: METADATA has no Name or Version"))
                });
            }
        }
        Err(PackageError::Io(format!("{tree} has no .dist-info")))
    }

    /// The hash, file name and origin (the index's base URL, or `wheelhouse`) a tree was
    /// unpacked from, as kept beside it.
    pub(super) fn tree_source(&self, tree: &str) -> (String, String, String) {
        let text =
            std::fs::read_to_string(self.store.join(format!(".{tree}.source"))).unwrap_or_default();
        let mut f = text.split_whitespace().map(str::to_string);
        (
            f.next().unwrap_or_default(),
            f.next().unwrap_or_default(),
            f.next().unwrap_or_default(),
        )
    }

    /// Reads or downloads the chosen wheel, checks it, keeps it by hash and unpacks it.
    pub(super) async fn fetch(
        &self,
        c: Chosen,
        compile: Compile<'_>,
    ) -> Result<(Installed, Vec<String>), PackageError> {
        // Wheels reach the cache through a temporary file, hashed as they are written, and are
        // unpacked from the very file that was hashed.
        let (got, sha) = match (&c.local, &c.remote) {
            (Some(path), _) => {
                let (path, wheels, wheel) = (path.clone(), self.wheels.clone(), c.wheel.clone());
                blocking(move || copy_in(&path, &wheels, &wheel)).await?
            }
            (None, Some((sha, url))) => {
                let kept = self.wheels.join(format!("{sha}.whl"));
                let want = sha.clone();
                match blocking(move || Ok(open_kept(&kept, &want))).await? {
                    Some(f) => (Got::Kept(f), sha.clone()),
                    None => {
                        let mut tmp = temp_in(&self.wheels)?;
                        let got = self
                            .index
                            .as_ref()
                            .expect("remote wheels come from the index")
                            .download(url, tmp.as_file_mut())
                            .await?;
                        (Got::Fresh(tmp), got)
                    }
                }
            }
            (None, None) => unreachable!("a chosen wheel is local or remote"),
        };
        if let Some((want, _)) = &c.remote
            && *want != sha
        {
            return Err(PackageError::Hash {
                what: format!("{} from the index", c.wheel),
                expected: want.clone(),
                got: sha,
            });
        }
        let kept = self.wheels.join(format!("{sha}.whl"));
        let file = blocking(move || match got {
            Got::Kept(f) => Ok(f),
            Got::Fresh(tmp) => keep(tmp, &kept),
        })
        .await?;
        let dist = c.name.replace('-', "_");
        let tree = format!("{dist}-{}-{}", c.version, &sha[..16]);
        let (meta, cached) = match self.tree_metadata(&tree) {
            Ok(m) => (m, true),
            Err(_) => {
                let (store, wheel) = (self.store.clone(), c.wheel.clone());
                let origin = match (&c.remote, &self.index) {
                    (Some(_), Some(i)) => i.base.as_str(),
                    _ => "wheelhouse",
                };
                let source = format!("{sha} {} {origin}", c.wheel);
                let (staged, m) = blocking(move || stage(&store, &wheel, file)).await?;
                if let Err(e) = compile(staged.0.clone(), format!("{PACKAGES_GUEST}/{tree}")).await
                {
                    tracing::warn!("compiling {tree}: {e}; its modules compile at each import");
                }
                let (store, t) = (self.store.clone(), tree.clone());
                blocking(move || finalize(&store, staged, &t, &source)).await?;
                (m, false)
            }
        };
        Ok((
            Installed {
                name: meta.name.clone(),
                version: meta.version.clone(),
                source: c.source,
                wheel: c.wheel,
                sha256: sha,
                cached,
                tree: PackageTree {
                    name: meta.name,
                    version: meta.version,
                    tree,
                },
            },
            meta.requires,
        ))
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, PackageError> + Send + 'static,
) -> Result<T, PackageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PackageError::Io(e.to_string()))?
}

/// A tree being prepared in a temporary folder of the store; removed unless it was renamed
/// into place (an install cancelled while its tree compiles leaves nothing behind).
struct Staged(PathBuf);

impl Drop for Staged {
    fn drop(&mut self) {
        if self.0.exists() {
            remove_tree(&self.0);
        }
    }
}

/// Unpacks into a temporary folder of the store (to be compiled, then [`finalize`]d).
fn stage(
    store: &Path,
    wheel: &str,
    mut file: std::fs::File,
) -> Result<(Staged, wheel::Metadata), PackageError> {
    use std::io::Seek as _;
    file.rewind()?;
    let staged = Staged(store.join(format!(".tmp-{}", uuid::Uuid::new_v4().simple())));
    std::fs::create_dir(&staged.0)?;
    let dir = Dir::open_ambient_dir(&staged.0, cap_std::ambient_authority())?;
    let meta = wheel::unpack(wheel, std::io::BufReader::new(file), &dir)?;
    Ok((staged, meta))
}

/// A wheel about to be unpacked: already in the cache, or just written and not yet kept.
enum Got {
    Kept(std::fs::File),
    Fresh(tempfile::NamedTempFile),
}

/// A new file in the wheel cache (removed unless [`keep`] renames it).
fn temp_in(wheels: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new().prefix(".tmp-").tempfile_in(wheels)
}

/// The cached wheel `kept`, if its content still has the SHA-256 `want` (hex).
fn open_kept(kept: &Path, want: &str) -> Option<std::fs::File> {
    let mut f = std::fs::File::open(kept).ok()?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).ok()?;
    (hex::encode(h.finalize()) == want).then_some(f)
}

/// A wheelhouse wheel copied into the cache, bounded by [`index::MAX_WHEEL`], with its SHA-256.
fn copy_in(path: &Path, wheels: &Path, name: &str) -> Result<(Got, String), PackageError> {
    let too_large = || PackageError::BadWheel {
        wheel: name.to_string(),
        why: format!("larger than {} MiB", index::MAX_WHEEL >> 20),
    };
    let mut src = std::fs::File::open(path)?;
    if src.metadata()?.len() > index::MAX_WHEEL as u64 {
        return Err(too_large());
    }
    let mut tmp = temp_in(wheels)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let max = index::MAX_WHEEL as u64;
    crate::bounded::copy_member(
        &mut src,
        u64::MAX,
        max,
        tmp.as_file_mut(),
        Some(&mut h),
        &mut buf,
    )
    .map_err(|e| match e {
        crate::bounded::Overrun::Io(e) => e.into(),
        _ => too_large(),
    })?;
    Ok((Got::Fresh(tmp), hex::encode(h.finalize())))
}

/// Renames a checked download to its place in the cache, synced as the store's other writes
/// are; the open file stays the one to unpack.
fn keep(tmp: tempfile::NamedTempFile, kept: &Path) -> Result<std::fs::File, PackageError> {
    tmp.as_file().sync_all()?;
    let f = tmp.persist(kept).map_err(|e| e.error)?;
    std::fs::File::open(kept.parent().unwrap_or(Path::new(".")))?.sync_all()?;
    Ok(f)
}

/// Makes a staged tree's files read-only and renames it into place, so a tree is whole or
/// absent.
fn finalize(store: &Path, staged: Staged, tree: &str, source: &str) -> Result<(), PackageError> {
    read_only(&staged.0)?;
    std::fs::write(store.join(format!(".{tree}.source")), source)?;
    match std::fs::rename(&staged.0, store.join(tree)) {
        Ok(()) => Ok(()),
        // Another server unpacked the same wheel meanwhile: theirs is the same bytes.
        Err(_) if store.join(tree).is_dir() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn read_only(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            read_only(&e.path())?;
        } else if t.is_file() {
            // Write bits off (0444 from 0644), on every platform.
            let mut p = e.metadata()?.permissions();
            p.set_readonly(true);
            std::fs::set_permissions(e.path(), p)?;
        }
    }
    Ok(())
}

fn remove_tree(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!("removing {}: {e}", dir.display());
    }
}
