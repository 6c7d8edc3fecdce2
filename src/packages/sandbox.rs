//! Installs as the library offers them: into a local sandbox (its list saved, its next Python
//! turn has them), or for one one-shot.

use std::sync::Arc;

use super::{Outcome, PackageError};
use crate::lang::Language;
use crate::sandbox::Sandbox;
use crate::{Error, Result, Wasmbox};

/// Requirements one call may name, and the length of one.
const MAX_REQUESTED: usize = 64;
const MAX_REQUIREMENT: usize = 256;

fn check(requested: &[String]) -> Result<()> {
    if requested.is_empty() {
        return Err(Error::invalid(
            "packages is empty: name at least one package",
        ));
    }
    if requested.len() > MAX_REQUESTED {
        return Err(Error::invalid(format!(
            "{} packages named; at most {MAX_REQUESTED} at a time",
            requested.len()
        )));
    }
    if let Some(r) = requested.iter().find(|r| r.len() > MAX_REQUIREMENT) {
        return Err(PackageError::BadRequirement(
            crate::fit::quote(r, crate::fit::QUOTE_CHARS),
            format!("longer than {MAX_REQUIREMENT} characters"),
        )
        .into());
    }
    Ok(())
}

impl Wasmbox {
    /// Installs `requested` into `sb`: its next Python turn imports them, no restart; they
    /// stay with it through restart, pause, fork and snapshot.
    pub async fn install_packages(
        &self,
        sb: &Arc<Sandbox>,
        requested: &[String],
    ) -> Result<Outcome> {
        sb.check_running()?;
        sb.check_language(Language::Python)?;
        check(requested)?;
        let out = self
            .inner
            .packages
            .install(requested, &sb.packages())
            .await?;
        sb.add_packages(out.installed.iter().map(|i| i.tree.clone()));
        Ok(out)
    }

    /// The trees (guest paths) a one-shot needs for `requested`: from the store when they are
    /// there, fetched and unpacked once otherwise.
    pub async fn oneshot_packages(&self, requested: &[String]) -> Result<(Vec<String>, Outcome)> {
        check(requested)?;
        let out = self.inner.packages.install(requested, &[]).await?;
        let paths = out.installed.iter().map(|i| i.tree.guest_path()).collect();
        Ok((paths, out))
    }

    /// The server's package sources and store.
    pub fn packages(&self) -> &super::Packages {
        &self.inner.packages
    }
}
