//! The package index as the host reads it: PyPI's JSON API (`{index}/pypi/{name}/json`), whose
//! files carry the SHA-256 every download is checked against. Answers and downloads are bounded
//! in size and time; the guest never talks to the index.

use std::time::Duration;

use serde::Deserialize;

use super::PackageError;

/// The largest project page and the largest wheel the host takes from the index.
const MAX_PAGE: usize = 32 << 20;
pub const MAX_WHEEL: usize = 128 << 20;

#[derive(Deserialize)]
pub struct Project {
    pub releases: std::collections::BTreeMap<String, Vec<File>>,
}

#[derive(Deserialize, Clone)]
pub struct File {
    pub filename: String,
    pub url: String,
    pub digests: Digests,
    #[serde(default)]
    pub yanked: bool,
}

#[derive(Deserialize, Clone)]
pub struct Digests {
    pub sha256: String,
}

pub struct Index {
    pub base: String,
    http: reqwest::Client,
}

impl Index {
    pub fn new(base: &str) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .user_agent(concat!("wasmbox/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a client with no custom TLS always builds");
        Self {
            base: base.trim_end_matches('/').to_string(),
            http,
        }
    }

    /// The project's page; `None` when the index does not know it.
    pub async fn project(&self, name: &str) -> Result<Option<Project>, PackageError> {
        let url = format!("{}/pypi/{name}/json", self.base);
        let r = self.get(&url).await?;
        if r.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let page = r.url().clone();
        let bytes = self.body(r, MAX_PAGE, &url).await?;
        let mut project: Project = serde_json::from_slice(&bytes)
            .map_err(|e| PackageError::Index(format!("{url}: not a PyPI JSON page: {e}")))?;
        // Mirrors give files relative to the page.
        for f in project.releases.values_mut().flatten() {
            if let Ok(u) = page.join(&f.url) {
                f.url = u.to_string();
            }
        }
        Ok(Some(project))
    }

    /// A file written into `to` as it arrives, bounded by [`MAX_WHEEL`]; returns its SHA-256
    /// (hex), which the caller checks.
    pub async fn download(
        &self,
        url: &str,
        to: &mut std::fs::File,
    ) -> Result<String, PackageError> {
        use sha2::Digest as _;
        use std::io::Write as _;
        let mut r = self.ok(self.get(url).await?, url)?;
        let (mut n, mut h) = (0usize, sha2::Sha256::new());
        while let Some(chunk) = self.chunk(&mut r, url).await? {
            n += chunk.len();
            if n > MAX_WHEEL {
                return Err(too_large(url, MAX_WHEEL));
            }
            h.update(&chunk);
            to.write_all(&chunk)?;
        }
        Ok(hex::encode(h.finalize()))
    }

    async fn get(&self, url: &str) -> Result<reqwest::Response, PackageError> {
        self.http
            .get(url)
            .send()
            .await
            .map_err(|e| PackageError::Index(format!("{url}: {}", chain(&e))))
    }

    fn ok(&self, r: reqwest::Response, url: &str) -> Result<reqwest::Response, PackageError> {
        if !r.status().is_success() {
            return Err(PackageError::Index(format!("{url}: HTTP {}", r.status())));
        }
        Ok(r)
    }

    async fn chunk(
        &self,
        r: &mut reqwest::Response,
        url: &str,
    ) -> Result<Option<bytes::Bytes>, PackageError> {
        r.chunk()
            .await
            .map_err(|e| PackageError::Index(format!("{url}: {}", chain(&e))))
    }

    async fn body(
        &self,
        r: reqwest::Response,
        max: usize,
        url: &str,
    ) -> Result<Vec<u8>, PackageError> {
        let mut r = self.ok(r, url)?;
        let mut out = Vec::new();
        while let Some(chunk) = self.chunk(&mut r, url).await? {
            if out.len() + chunk.len() > max {
                return Err(too_large(url, max));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }
}

fn too_large(url: &str, max: usize) -> PackageError {
    PackageError::Index(format!("{url}: larger than {} MiB", max >> 20))
}

/// An error with its causes, which say what failed (DNS, TLS, a refused connection).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s += &format!(": {c}");
        cause = c.source();
    }
    s
}
