//! Forking a sandbox: its files copied, its sessions copied in memory or as files, reseeded.

use std::sync::Arc;

use super::save::{PAUSE_WAIT, hold};
use super::snapshot::{CopyError, copy_dirs};
use crate::lang::Language;
use crate::sandbox::Sandbox;
use crate::sandbox::slot::SESSION_LANGUAGES;
use crate::{Error, Result, Wasmbox};

impl Wasmbox {
    /// A new sandbox of `owner` whose files, env and session variables equal sandbox `id`'s now
    /// and are its own from then on. Live sessions are copied in memory (the child's first call
    /// finds them ready), saved ones as files; either way the child's random generators are
    /// reseeded. Calls in the source wait meanwhile.
    pub async fn fork_sandbox(&self, id: &str, owner: &str) -> Result<(Arc<Sandbox>, Vec<String>)> {
        let src = self.inner.sandboxes.get(id, owner)?;
        let mut held = Vec::new();
        for language in SESSION_LANGUAGES {
            let slot = src.slot(language).expect("a slot per session language");
            held.push((language, hold(slot, language, PAUSE_WAIT).await?));
        }
        let child = self.inner.sandboxes.create_unfilled(
            src.template.id,
            Some(src.timeout().as_secs() as i64),
            src.env(),
            owner,
        )?;
        *child.allow_hosts_mut() = src.allow_hosts();
        *child.packages_mut() = src.packages();
        // The files are copied on a blocking thread while the sessions are, on a guest thread.
        let files = {
            let (src, child) = (src.clone(), child.clone());
            tokio::task::spawn_blocking(move || copy_files(&src, &child))
        };
        let sessions = self.fork_sessions(&src, &child, held).await;
        let copied = files.await.unwrap_or_else(|e| Err(CopyError::Panicked(e)));
        let failed = match (sessions, copied) {
            (Ok(notes), Ok(())) => {
                // Its meta.json is synced off the caller's path.
                self.inner.sandboxes.publish(&child, false);
                let synced = child.clone();
                tokio::task::spawn_blocking(move || synced.sync_saved());
                return Ok((child, notes));
            }
            (Err(e), _) => e,
            (_, Err(e)) => Error::wasm(format!("the sandbox's files could not be copied: {e}")),
        };
        self.inner.sandboxes.discard(&child.id);
        Err(failed)
    }

    /// Copies `src`'s sessions, whose slots are `held`, into `child`: live ones in memory, saved
    /// ones as files. Notes what could not be copied.
    async fn fork_sessions(
        &self,
        src: &Sandbox,
        child: &Sandbox,
        held: Vec<(
            Language,
            tokio::sync::OwnedMutexGuard<crate::sandbox::slot::Slot>,
        )>,
    ) -> Result<Vec<String>> {
        let mut notes = Vec::new();
        for (language, guard) in held {
            if !guard.is_live() {
                let from = src.state_path(language);
                if from.is_file()
                    && let Err(e) = self.copy_state(&from, child, language)
                {
                    notes.push(format!(
                        "the saved {} session could not be copied ({e}); the fork starts a fresh one",
                        language.name()
                    ));
                }
                continue;
            }
            let Some(rt) = self.inner.runtimes.loaded_session(language) else {
                continue;
            };
            let mut req = self.request(crate::ExecOptions {
                language: language.as_str().into(),
                ..Default::default()
            })?;
            req.place = Some(child.place(
                crate::lang::guest::WORKSPACE_GUEST.into(),
                child.stop.clone(),
            ));
            let target = child
                .slot(language)
                .expect("a slot per session language")
                .clone()
                .lock_owned()
                .await;
            let copied = self
                .inner
                .guests
                .run(move || {
                    let (mut guard, mut target) = (guard, target);
                    let r = guard.fork_into(&*rt, &req, &mut target);
                    drop(guard);
                    Ok::<_, Error>(r)
                })
                .await?;
            match copied {
                Ok(mut n) => notes.append(&mut n),
                Err(e) => notes.push(format!(
                    "the {} session could not be copied ({e}); the fork starts a fresh one",
                    language.name()
                )),
            }
        }
        Ok(notes)
    }
}

/// Copies `src`'s `/workspace` and `/tmp` into `child`'s, counted in the child's budget.
fn copy_files(src: &Sandbox, child: &Sandbox) -> std::result::Result<(), CopyError> {
    let c = copy_dirs(
        src,
        &child.fs.host_workspace(),
        &child.fs.host_tmp(),
        child.fs.quota(),
    )?;
    child.fs.budget().changed(c.bytes as i64, c.entries as i64);
    Ok(())
}
