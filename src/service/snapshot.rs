//! Snapshots: a sandbox's files, env and sessions kept, and sandboxes created from them.

use std::sync::Arc;

use super::save::{PAUSE_WAIT, hold};
use crate::lang::Language;
use crate::sandbox::Sandbox;
use crate::sandbox::budget::{self, Reservation, StateGate};
use crate::sandbox::copy::Copied;
use crate::sandbox::slot::{self, SESSION_LANGUAGES};
use crate::sandbox::snapshots::{self, SnapshotError, SnapshotMeta};
use crate::{Error, Result, Wasmbox};

/// Why a sandbox's files or sessions could not be copied (snapshot, fork); the caller says
/// into what.
#[derive(Debug, thiserror::Error)]
pub(super) enum CopyError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The owner's budget has no room, in its words.
    #[error("{0}")]
    Refused(String),
    #[error("the {} session: {source}", language.name())]
    Session {
        language: Language,
        source: Box<CopyError>,
    },
    #[error("the {} session: {source}", language.name())]
    Save {
        language: Language,
        source: slot::SlotError,
    },
    #[error("copying the saved {} session: {source}", language.name())]
    Saved {
        language: Language,
        source: std::io::Error,
    },
    #[error("copying panicked: {0}")]
    Panicked(tokio::task::JoinError),
}

impl Wasmbox {
    /// Keeps sandbox `id`'s files, env and sessions as a snapshot of its own (the sandbox runs
    /// on unchanged). Calls in the sandbox wait meanwhile.
    pub async fn snapshot_sandbox(&self, id: &str, owner: &str) -> Result<SnapshotMeta> {
        let src = self.inner.sandboxes.get(id, owner)?;
        let mut held = Vec::new();
        for language in SESSION_LANGUAGES {
            let slot = src.slot(language).expect("a slot per session language");
            held.push((language, hold(slot, language, PAUSE_WAIT).await?));
        }
        let sandboxes = self.inner.sandboxes.clone();
        let reservation = {
            let (src, sandboxes, owner) = (src.clone(), sandboxes.clone(), owner.to_string());
            tokio::task::spawn_blocking(move || -> Result<Reservation> {
                let estimate = snapshot_estimate(&src).map_err(|e| {
                    SnapshotError::Io(format!("the sandbox's files could not be measured: {e}"))
                })?;
                let r = sandboxes
                    .snapshots
                    .ledger()
                    .reserve(&owner, estimate, || sandboxes.owner_used(&owner, None))
                    .map_err(SnapshotError::from)?;
                Ok(r)
            })
            .await
            .unwrap_or_else(|e| Err(Error::wasm(format!("measuring panicked: {e}"))))?
        };
        let reservation = Arc::new(reservation);
        let store = &sandboxes.snapshots;
        let (snap_id, dir) = store.start()?;
        let made = self.fill_snapshot(&src, held, &dir, &reservation).await;
        let (size_bytes, languages) = match made {
            Ok(m) => m,
            Err(e) => {
                store.abandon(&snap_id);
                return Err(SnapshotError::Io(e.to_string()).into());
            }
        };
        let mut meta = SnapshotMeta {
            snapshot_id: snap_id,
            sandbox_id: src.id.clone(),
            owner: owner.to_string(),
            template: src.template.id.to_string(),
            env: src.env(),
            allow_hosts: src.allow_hosts(),
            packages: src.packages(),
            created_at_ms: snapshots::now_ms(),
            languages,
            size_bytes,
            cost_bytes: None,
            charged_bytes: 0,
        };
        let owner = owner.to_string();
        tokio::task::spawn_blocking(move || {
            sandboxes
                .snapshots
                .finish(&mut meta, &reservation, || {
                    sandboxes.states_used(&owner, None)
                })
                .map(|()| meta)
        })
        .await
        .unwrap_or_else(|e| Err(SnapshotError::Io(format!("finishing panicked: {e}"))))
        .map_err(Error::from)
    }

    /// Writes `src`'s files and sessions into snapshot directory `dir`: their bytes, and the
    /// languages whose sessions it holds.
    async fn fill_snapshot(
        &self,
        src: &Arc<Sandbox>,
        held: Vec<(
            Language,
            tokio::sync::OwnedMutexGuard<crate::sandbox::slot::Slot>,
        )>,
        dir: &std::path::Path,
        reservation: &Arc<Reservation>,
    ) -> std::result::Result<(u64, Vec<Language>), CopyError> {
        let files = {
            let (src, dir) = (src.clone(), dir.to_path_buf());
            // No more than was reserved: every byte and every entry costs at least that much.
            let q = src.fs.quota();
            let quota = crate::engine::disk::Quota {
                max_bytes: q.max_bytes.min(reservation.amount()),
                max_entries: q.max_entries.min(reservation.amount() / budget::PER_ENTRY),
            };
            tokio::task::spawn_blocking(move || {
                copy_dirs(&src, &dir.join("workspace"), &dir.join("tmp"), quota)
            })
            .await
            .unwrap_or_else(|e| Err(CopyError::Panicked(e)))?
        };
        let mut size = files.bytes;
        let mut languages = Vec::new();
        for (language, guard) in held {
            let to = snapshots::state_path(dir, language);
            // A session saved as it is (idle) is copied as its file, like one not live.
            let bytes = if guard.is_live() && !guard.saved_as_is() {
                let Some(rt) = self.inner.runtimes.loaded_session(language) else {
                    continue;
                };
                let gate = budget::SnapshotGate {
                    sandboxes: self.inner.sandboxes.clone(),
                    reservation: reservation.clone(),
                };
                tokio::task::spawn_blocking(move || {
                    let mut guard = guard;
                    guard.save_copy(&*rt, &to, &gate)
                })
                .await
                .unwrap_or_else(|e| Err(slot::SlotError::Panicked(e)))
                .map_err(|source| CopyError::Save { language, source })?
            } else {
                let from = src.state_path(language);
                if !from.is_file() {
                    continue;
                }
                std::fs::copy(&from, &to).map_err(|source| CopyError::Saved { language, source })?
            };
            size += bytes;
            languages.push(language);
        }
        Ok((size, languages))
    }

    /// A new sandbox of `owner` holding snapshot `snapshot_id`'s files, env (with `env` on top)
    /// and sessions; the sessions are restored, with fresh random generators, by its first
    /// call in each language.
    pub async fn create_from_snapshot(
        &self,
        snapshot_id: &str,
        template: Option<&str>,
        timeout_secs: Option<i64>,
        env: std::collections::BTreeMap<String, String>,
        owner: &str,
    ) -> Result<Arc<Sandbox>> {
        let (meta, dir) = self.inner.sandboxes.snapshots.get(snapshot_id, owner)?;
        if let Some(t) = template.filter(|t| *t != meta.template) {
            return Err(Error::invalid(format!(
                "snapshot {snapshot_id} is of template '{}', not '{t}': create_sandbox from it \
                 takes its template (leave template_id out)",
                meta.template
            )));
        }
        let mut all_env = meta.env.clone();
        all_env.extend(env);
        let sandboxes = self.inner.sandboxes.clone();
        let sb = sandboxes.create_unfilled(&meta.template, timeout_secs, all_env, owner)?;
        *sb.allow_hosts_mut() = meta.allow_hosts.clone();
        *sb.packages_mut() = meta.packages.clone();
        let filled = {
            let (sb, dir, me, sandboxes) =
                (sb.clone(), dir.clone(), self.clone(), sandboxes.clone());
            tokio::task::spawn_blocking(move || -> std::result::Result<(), CopyError> {
                let c = copy_into(&dir.join("workspace"), &dir.join("tmp"), &sb)?;
                sb.fs.budget().changed(c.bytes as i64, c.entries as i64);
                for language in meta.languages {
                    let from = snapshots::state_path(&dir, language);
                    me.copy_state(&from, &sb, language)
                        .map_err(|e| CopyError::Session {
                            language,
                            source: Box::new(e),
                        })?;
                }
                sandboxes.publish(&sb, true);
                Ok(())
            })
            .await
            .unwrap_or_else(|e| Err(CopyError::Panicked(e)))
        };
        if let Err(e) = filled {
            sandboxes.discard(&sb.id);
            return Err(SnapshotError::Io(format!("the snapshot could not be copied: {e}")).into());
        }
        Ok(sb)
    }
}

impl Wasmbox {
    /// Copies the saved session at `from` into `to`'s state files, if its owner's budget has
    /// room for it.
    pub(super) fn copy_state(
        &self,
        from: &std::path::Path,
        to: &Sandbox,
        language: Language,
    ) -> std::result::Result<(), CopyError> {
        let path = to.state_path(language);
        let len = std::fs::metadata(from)?.len();
        let _room = self
            .inner
            .sandboxes
            .state_gate(&to.owner)
            .admit(&path, len)
            .map_err(|e| CopyError::Refused(e.to_string()))?;
        Ok(slot::copy_reseeded(from, &path)?)
    }
}

/// What a snapshot of `src` is expected to cost before its live sessions are saved: its files
/// and saved sessions as they are now, the snapshot's own directories and its `meta.json`.
fn snapshot_estimate(src: &Sandbox) -> std::io::Result<u64> {
    let mut total = budget::measure(&src.fs.host_workspace())?
        + budget::measure(&src.fs.host_tmp())?
        // The snapshot's directory and its state/, and meta.json.
        + 2 * budget::file_cost(budget::BLOCK)
        + budget::file_cost(2 * budget::BLOCK);
    for language in SESSION_LANGUAGES {
        if let Ok(m) = std::fs::metadata(src.state_path(language)) {
            total += budget::file_cost(m.len());
        }
    }
    Ok(total)
}

/// Copies `src`'s `/workspace` and `/tmp` into the directories `ws` and `tmp`, within `quota`
/// in all.
pub(super) fn copy_dirs(
    src: &Sandbox,
    ws: &std::path::Path,
    tmp: &std::path::Path,
    quota: crate::engine::disk::Quota,
) -> std::result::Result<Copied, CopyError> {
    copy_pair(
        [
            (src.fs.host_workspace(), ws.to_path_buf()),
            (src.fs.host_tmp(), tmp.to_path_buf()),
        ],
        quota,
    )
}

/// Copies the directories `ws` and `tmp` into `dst`'s `/workspace` and `/tmp`, within its quota.
fn copy_into(
    ws: &std::path::Path,
    tmp: &std::path::Path,
    dst: &Sandbox,
) -> std::result::Result<Copied, CopyError> {
    copy_pair(
        [
            (ws.to_path_buf(), dst.fs.host_workspace()),
            (tmp.to_path_buf(), dst.fs.host_tmp()),
        ],
        dst.fs.quota(),
    )
}

fn copy_pair(
    pairs: [(std::path::PathBuf, std::path::PathBuf); 2],
    quota: crate::engine::disk::Quota,
) -> std::result::Result<Copied, CopyError> {
    let mut total = Copied::default();
    for (from, to) in pairs {
        let left = crate::engine::disk::Quota {
            max_bytes: quota.max_bytes.saturating_sub(total.bytes),
            max_entries: quota.max_entries.saturating_sub(total.entries),
        };
        let c = crate::sandbox::copy::copy_tree(&from, &to, left)?;
        total.bytes += c.bytes;
        total.entries += c.entries;
    }
    Ok(total)
}
