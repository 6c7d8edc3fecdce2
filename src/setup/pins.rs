//! Per-platform pins: the toolchains setup runs on the host (Go, zig) are native programs, so the
//! manifest pins one wheel per platform, and setup takes the running platform's.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

/// One platform's wheel of a host toolchain.
#[derive(Clone, Debug, Deserialize)]
pub(super) struct Pin {
    pub wheel: String,
    pub sha256: String,
    /// The toolchain's program inside the wheel (`.exe` on Windows).
    pub binary: String,
}

/// Pins by platform name, as [`here`] spells them.
pub(super) type Platforms = BTreeMap<String, Pin>;

/// A host toolchain pinned per platform (zig, under the JavaScript build).
#[derive(Clone, Debug, Deserialize)]
pub(super) struct Tool {
    pub package: String,
    pub version: String,
    pub platforms: Platforms,
}

/// The platforms the manifest pins for each host toolchain, wasmbox's targets.
#[cfg(test)]
pub(super) const TARGETS: [&str; 5] = [
    "linux-x86_64",
    "linux-aarch64",
    "macos-aarch64",
    "macos-x86_64",
    "windows-x86_64",
];

/// This machine's platform, as the manifest names them: Rust's `{OS}-{ARCH}`
/// (`linux-x86_64`, `linux-aarch64`, `macos-aarch64`, `macos-x86_64`, `windows-x86_64`).
pub(super) fn here() -> String {
    format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH)
}

/// No pin of `tool` for `platform`; says which platforms have one.
#[derive(Debug, PartialEq)]
pub(super) struct NoPin {
    pub tool: String,
    pub platform: String,
    pub pinned: Vec<String>,
}

impl fmt::Display for NoPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: no pinned toolchain for {} (pinned: {})",
            self.tool,
            self.platform,
            if self.pinned.is_empty() {
                "none".to_string()
            } else {
                self.pinned.join(", ")
            }
        )
    }
}

impl std::error::Error for NoPin {}

/// `tool`'s pin for `platform`.
pub(super) fn pick<'a>(
    tool: &str,
    platforms: &'a Platforms,
    platform: &str,
) -> Result<&'a Pin, NoPin> {
    platforms.get(platform).ok_or_else(|| NoPin {
        tool: tool.to_string(),
        platform: platform.to_string(),
        pinned: platforms.keys().cloned().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::{Entry, MANIFEST};

    fn built_in() -> BTreeMap<String, Entry> {
        toml::from_str(MANIFEST).unwrap()
    }

    /// The built-in manifest's Go and zig pins.
    fn toolchains() -> [(&'static str, Platforms); 2] {
        let m = built_in();
        let zig = m["quickjs"].zig.clone().expect("quickjs pins zig");
        [("go", m["go"].platforms.clone()), ("zig", zig.platforms)]
    }

    fn pin(wheel: &str) -> Pin {
        Pin {
            wheel: wheel.into(),
            sha256: "0".repeat(64),
            binary: "bin/tool".into(),
        }
    }

    #[test]
    fn each_platform_picks_its_own_wheel() {
        let platforms: Platforms = TARGETS
            .iter()
            .map(|t| (t.to_string(), pin(&format!("{t}.whl"))))
            .collect();
        for t in TARGETS {
            assert_eq!(pick("go", &platforms, t).unwrap().wheel, format!("{t}.whl"));
        }
        // And in the built-in manifest, each platform's wheel is built for it.
        let tags = [
            ("linux-x86_64", "manylinux", "x86_64"),
            ("linux-aarch64", "manylinux", "aarch64"),
            ("macos-aarch64", "macosx_", "arm64"),
            ("macos-x86_64", "macosx_", "x86_64"),
            ("windows-x86_64", "win_amd64", ""),
        ];
        for (tool, platforms) in toolchains() {
            for (t, os, arch) in tags {
                let w = &pick(tool, &platforms, t).unwrap().wheel;
                let tag = w.split("-none-").nth(1).unwrap_or_default();
                assert!(tag.starts_with(os) && tag.contains(arch), "{tool} {t}: {w}");
            }
        }
    }

    /// Setup puts Go's program at the manifest's `dest` joined with its platform's `binary`,
    /// which is where the server looks for it.
    #[test]
    fn the_pinned_go_is_where_the_server_looks() {
        let go = &built_in()["go"];
        let dest = std::path::Path::new(go.dest.as_deref().unwrap());
        for (t, p) in &go.platforms {
            let bin = dest.join(&p.binary);
            let bin = bin.to_str().unwrap();
            assert_eq!(
                bin.strip_suffix(".exe").unwrap_or(bin),
                "go/go/bin/go",
                "{t}"
            );
        }
        if let Ok(p) = pick("go", &go.platforms, &here()) {
            let root = std::path::Path::new("rt");
            assert_eq!(
                root.join(dest).join(&p.binary),
                crate::lang::go::pinned_go(root)
            );
        }
    }

    #[test]
    fn an_unpinned_platform_is_named_with_the_pinned_ones() {
        let platforms: Platforms = [
            ("linux-x86_64", pin("a.whl")),
            ("macos-aarch64", pin("b.whl")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let e = pick("go", &platforms, "freebsd-x86_64").unwrap_err();
        assert_eq!(
            e.to_string(),
            "go: no pinned toolchain for freebsd-x86_64 (pinned: linux-x86_64, macos-aarch64)"
        );
        let e = pick("zig", &Platforms::new(), "linux-riscv64").unwrap_err();
        assert_eq!(
            e.to_string(),
            "zig: no pinned toolchain for linux-riscv64 (pinned: none)"
        );
    }

    #[test]
    fn the_built_in_manifest_pins_go_and_zig_for_every_target() {
        for (tool, platforms) in toolchains() {
            let names: Vec<_> = platforms.keys().map(String::as_str).collect();
            let mut want = TARGETS.to_vec();
            want.sort();
            assert_eq!(names, want, "{tool}");
            for (t, p) in &platforms {
                assert!(
                    p.sha256.len() == 64
                        && p.sha256
                            .bytes()
                            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
                    "{tool} {t}: {}",
                    p.sha256
                );
                assert!(p.wheel.ends_with(".whl"), "{tool} {t}: {}", p.wheel);
                let exe = t.starts_with("windows-");
                assert_eq!(p.binary.ends_with(".exe"), exe, "{tool} {t}: {}", p.binary);
            }
            let mut shas: Vec<_> = platforms.values().map(|p| &p.sha256).collect();
            shas.sort();
            shas.dedup();
            assert_eq!(
                shas.len(),
                platforms.len(),
                "{tool}: one wheel pinned twice"
            );
        }
    }
}
