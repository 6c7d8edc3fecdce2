//! Installs as the library offers them: into a local sandbox (its list saved, its next Python
//! turn has them), or for one one-shot.

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;

use super::exec::ExecOptions;
use crate::engine::cpu::Owner;
use crate::lang::{Language, Place};
use crate::packages::{Outcome, PackageError, Packages};
use crate::sandbox::Sandbox;
use crate::{Error, Result, Wasmbox};

/// What compiling one tree may take: a large pure-Python package compiles in a few seconds.
const COMPILE_TIMEOUT_S: f64 = 120.0;

/// Compiles every module of the tree the guest sees at `/workspace` with the interpreter that
/// will import it (its cache tag, its magic number). Unchecked hashes: the tree is read-only
/// and never changes under its name, so no import needs to look at the source.
const COMPILE: &str = "import compileall, os, py_compile
compileall.compile_dir('/workspace', ddir=os.environ['TREE'], quiet=2, workers=1,
    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
";

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
        let compile = self.compiler(sb.owner.as_str().into());
        let out = self
            .inner
            .packages
            .install(requested, &sb.packages(), &compile)
            .await?;
        sb.add_packages(out.installed.iter().map(|i| i.tree.clone()));
        Ok(out)
    }

    /// The trees (guest paths) a one-shot needs for `requested`: from the store when they are
    /// there, fetched and unpacked once otherwise.
    pub async fn oneshot_packages(
        &self,
        requested: &[String],
        owner: &Owner,
    ) -> Result<(Vec<String>, Outcome)> {
        check(requested)?;
        let compile = self.compiler(owner.clone());
        let out = self
            .inner
            .packages
            .install(requested, &[], &compile)
            .await?;
        let paths = out.installed.iter().map(|i| i.tree.guest_path()).collect();
        Ok((paths, out))
    }

    /// The server's package sources and store.
    pub fn packages(&self) -> &Packages {
        &self.inner.packages
    }

    /// Compiles new trees as `owner`'s work (its share of the CPU slots).
    fn compiler(
        &self,
        owner: Owner,
    ) -> impl Fn(PathBuf, String) -> BoxFuture<'static, std::result::Result<(), String>> + Send + Sync
    {
        let me = self.clone();
        move |tree, guest| {
            let (me, owner) = (me.clone(), owner.clone());
            Box::pin(async move {
                me.compile_tree(tree, guest, owner)
                    .await
                    .map_err(|e| e.to_string())
            })
        }
    }

    /// Runs [`COMPILE`] in a Python guest whose `/workspace` is the staged tree `tree`.
    async fn compile_tree(&self, tree: PathBuf, guest: String, owner: Owner) -> Result<()> {
        let shown = guest.clone();
        let scratch = tempfile::tempdir().map_err(|e| PackageError::Io(e.to_string()))?;
        let mut req = self.request(ExecOptions {
            language: "python".into(),
            code: COMPILE.into(),
            env: [("TREE".to_string(), guest)].into(),
            timeout_secs: Some(COMPILE_TIMEOUT_S),
            owner: Some(owner),
            ..Default::default()
        })?;
        req.reach = None;
        req.images = None;
        req.place = Some(Place {
            workspace: tree,
            tmp: scratch.path().into(),
            cwd: crate::lang::guest::WORKSPACE_GUEST.into(),
            stop: Default::default(),
            disk: None,
            output: None,
        });
        let r = self.execute(req).await?;
        if !r.success {
            return Err(Error::invalid(format!(
                "compileall exited {}{}: {}",
                r.exit_code,
                r.limit.map(|l| format!(" ({l:?})")).unwrap_or_default(),
                crate::fit::quote(&r.stderr, crate::fit::QUOTE_CHARS)
            )));
        }
        tracing::debug!("compiled {shown} in {:.3} s", r.execution_time);
        Ok(())
    }
}
