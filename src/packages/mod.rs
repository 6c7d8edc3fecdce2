//! Pure-Python packages installed at run time. The host resolves them, never the guest: from a
//! wheelhouse folder (`WASMBOX_WHEELHOUSE`) and then the package index (`WASMBOX_PACKAGE_INDEX`,
//! PyPI's JSON API) unless offline; only `py3-none-any` wheels; dependencies from `Requires-Dist`
//! with markers evaluated for this interpreter; the runtime's bundled packages satisfy what they
//! can and are never shadowed. Index wheels are checked against the index's SHA-256 and every
//! wheel's members against its RECORD; wheels are kept by hash in `<cache>/wheels` and unpacked
//! once into a read-only tree per wheel in `<cache>/packages`, which every Python guest sees at
//! [`PACKAGES_GUEST`]. A sandbox's packages are a list of those trees on its `sys.path`.

mod error;
mod index;
mod resolver;
mod store;
pub mod wheel;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use pep508_rs::MarkerEnvironment;
use serde::Serialize;

use crate::lang::python::PackageTree;
pub use error::PackageError;
use wheel::{WheelName, normalize};

/// Compiles a freshly unpacked tree's modules (its host folder, the guest path it will have)
/// before it is made read-only: guests cannot write bytecode into the store, so a tree left
/// as source is compiled again by every interpreter that imports it. A failure leaves the
/// tree as source (slower imports, same behaviour).
pub type Compile<'a> = &'a (
        dyn Fn(PathBuf, String) -> futures::future::BoxFuture<'static, Result<(), String>>
            + Send
            + Sync
    );

/// What the bundled Python imports besides the standard library (each checked with `import`).
pub const PYTHON_BUNDLED: &str = "numpy, pandas, scipy, scikit-learn (sklearn), matplotlib, seaborn, \
statsmodels, sympy, Pillow (PIL), networkx, beautifulsoup4 (bs4), lxml, PyYAML (yaml), regex, tqdm, \
joblib, python-dateutil, jinja2, openpyxl, tabulate, mpmath, patsy, toolz, cloudpickle";

/// The cloud route for what cannot run locally.
pub const HOPX_ROUTE: &str = "For other packages, run in the HOPX cloud, where pip works: with \
HOPX_API_KEY set, create_sandbox with internet_access: true.";

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
    pub tree: PackageTree,
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
            markers: resolver::markers(),
            busy: tokio::sync::Mutex::new(()),
            lookups: Default::default(),
        })
    }

    /// The host folder Python guests see at [`PACKAGES_GUEST`].
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
}
