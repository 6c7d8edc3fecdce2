//! Folders the server lends beside a workspace, as the file tools reach them: which folder a
//! guest path falls in, where a change there is made and counted (a `ro` folder refuses), and
//! what `/data` or `/mnt` lists when only folders below it are lent.

use std::path::PathBuf;
use std::sync::Arc;

use cap_std::fs::Dir;

use super::fs::{Entry, FsError, GuestPath, Workspace, io_err, permissions};
use crate::engine::disk::DiskBudget;
use crate::lang::mounts::Layout;

impl Workspace {
    /// The workspace with `owner`'s folders lent beside it.
    pub fn lent(self, owner: &str) -> Self {
        Self {
            owner: Some(owner.into()),
            ..self
        }
    }

    /// The folders lent beside it.
    pub fn mounts(&self) -> &'static Layout {
        match &self.owner {
            Some(o) => crate::lang::mounts::for_owner(o),
            None => crate::lang::mounts::none(),
        }
    }

    /// The directory a path resolves in: the workspace, or a lent folder.
    pub(super) fn dir_of(&self, p: &GuestPath) -> &Dir {
        match p.mount {
            None => &self.dir,
            Some(i) => &self.mounts().dirs[i],
        }
    }

    /// Where a change at `p` is made and counted: the workspace, or a lent `rw` folder (a
    /// read-only one refuses).
    pub(super) fn writable(&self, p: &GuestPath) -> Result<(&Dir, &Arc<DiskBudget>), FsError> {
        match p.mount {
            None => Ok((&self.dir, &self.budget)),
            Some(i) => {
                let layout = self.mounts();
                match &layout.budgets[i] {
                    Some(b) => Ok((&layout.dirs[i], b)),
                    None => Err(FsError::ReadOnly(p.guest.clone())),
                }
            }
        }
    }
}

/// The lent folder `path` falls in: its index, guest root and the rest (no leading `/`).
pub(super) fn lent_at<'a>(layout: &'a Layout, path: &'a str) -> Option<(usize, &'a str, &'a str)> {
    layout.mounts.iter().enumerate().find_map(|(i, m)| {
        path.strip_prefix(m.guest.as_str())
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
            .map(|rest| (i, m.guest.as_str(), rest.trim_start_matches('/')))
    })
}

/// `/data` or `/mnt` when only folders below it are lent: those folders.
pub(super) fn list_slot(
    layout: &Layout,
    path: &str,
) -> Option<Result<(GuestPath, Vec<Entry>), FsError>> {
    let slot = path.trim_end_matches('/');
    if !crate::lang::guest::MOUNT_SLOTS.contains(&slot) || layout.at_slot(slot).is_some() {
        return None;
    }
    let p = GuestPath {
        rel: PathBuf::from("."),
        guest: slot.to_string(),
        mount: None,
    };
    let mut out = Vec::new();
    for (name, i, m) in layout.below(slot) {
        let meta = match layout.dirs[i].dir_metadata() {
            Ok(meta) => meta,
            Err(e) => return Some(Err(io_err(&p, e))),
        };
        out.push(Entry {
            path: m.guest.clone(),
            name: name.to_string(),
            size: meta.len(),
            is_directory: true,
            modified_time: meta
                .modified()
                .ok()
                .map(|t| humantime::format_rfc3339_seconds(t.into_std()).to_string()),
            permissions: permissions(&meta),
        });
    }
    if out.is_empty() {
        return None;
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Some(Ok((p, out)))
}
