//! Which files a setup verified, by size and mtime, so a run with everything present hashes
//! nothing.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::fetch::{sha256_file, write_atomic};

const STAMPS: &str = ".verified.json";

#[derive(Default, Serialize, Deserialize)]
pub(super) struct Stamp {
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stat: Option<(u64, i128)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
}

/// Which files were verified, by size and mtime, so unchanged files are not hashed again.
#[derive(Default)]
pub(super) struct Stamps {
    dir: PathBuf,
    force: bool,
    data: BTreeMap<String, Stamp>,
}

pub(super) fn stat_key(path: &Path) -> Option<(u64, i128)> {
    let m = fs::metadata(path).ok()?;
    // Nanoseconds since the epoch, as Unix's mtime and mtime_nsec gave them before.
    let t = m.modified().ok()?;
    let nanos = match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    };
    Some((m.len(), nanos))
}

impl Stamps {
    pub(super) fn load(dir: &Path, force: bool) -> Self {
        let data = fs::read(dir.join(STAMPS))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Self {
            dir: dir.into(),
            force,
            data,
        }
    }

    /// `rel` is there with `sha` (by its stamp, else hashed now).
    pub(super) fn ok(&mut self, rel: &str, sha: &str) -> bool {
        let path = self.dir.join(rel);
        if !path.is_file() {
            return false;
        }
        if let Some(s) = self.data.get(rel)
            && !self.force
            && s.sha256.as_deref() == Some(sha)
            && s.stat == stat_key(&path)
        {
            return true;
        }
        if sha256_file(&path).is_ok_and(|h| h == sha) {
            self.record(rel, sha);
            return true;
        }
        false
    }

    pub(super) fn record(&mut self, rel: &str, sha: &str) {
        self.data.insert(
            rel.into(),
            Stamp {
                sha256: Some(sha.into()),
                stat: stat_key(&self.dir.join(rel)),
                token: None,
            },
        );
    }

    pub(super) fn marker_ok(&self, rel: &str, token: &str) -> bool {
        self.dir.join(rel).is_dir()
            && self.data.get(rel).and_then(|s| s.token.as_deref()) == Some(token)
    }

    pub(super) fn mark(&mut self, rel: &str, token: &str) {
        self.data.insert(
            rel.into(),
            Stamp {
                token: Some(token.into()),
                ..Default::default()
            },
        );
    }

    pub(super) fn save(&self) -> Result<()> {
        write_atomic(
            &self.dir.join(STAMPS),
            &serde_json::to_vec_pretty(&self.data)?,
        )
    }
}
