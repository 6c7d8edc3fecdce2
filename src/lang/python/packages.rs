//! Installed packages as Python guests see them: the store's place in the guest and one
//! unpacked tree in it, which a sandbox keeps and the package store makes.

use serde::{Deserialize, Serialize};

/// Where the store of unpacked trees appears in Python guests (read-only).
pub const PACKAGES_GUEST: &str = "/packages";

/// One installed package as a sandbox keeps it (in `meta.json`, forks and snapshots).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct PackageTree {
    pub name: String,
    pub version: String,
    /// Its folder under [`PACKAGES_GUEST`].
    pub tree: String,
}

impl PackageTree {
    pub fn guest_path(&self) -> String {
        format!("{PACKAGES_GUEST}/{}", self.tree)
    }
}
