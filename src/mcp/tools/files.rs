//! A sandbox's files: `file_*`. Every read is a window sized by the call and the server's
//! budgets, never by the file (a sparse file can claim a terabyte).

use base64::Engine as _;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::args::{Parameters, lenient, lenient_opt};
use super::error::ToolError;
use super::reply::{Json, fit_list, on_disk, pretty, shown};
use super::{Budget, Target, WasmboxServer};
use crate::lang::guest::WORKSPACE_GUEST;
use crate::sandbox::fs::FsError;

#[derive(Deserialize, JsonSchema)]
pub struct PathArgs {
    /// The sandbox id (from create_sandbox).
    pub sandbox_id: String,
    /// Under /workspace: absolute (/workspace/...) or relative to it.
    pub path: String,
}

#[derive(Deserialize, JsonSchema)]
pub struct ReadArgs {
    /// The sandbox id (from create_sandbox).
    pub sandbox_id: String,
    /// Under /workspace: absolute (/workspace/...) or relative to it.
    pub path: String,
    /// Where to start, in bytes (default 0). A truncated answer's next_offset continues it.
    #[serde(default, deserialize_with = "lenient_opt")]
    pub offset: Option<u64>,
    /// The most to return. file_read: bytes of text as JSON carries it (a newline or quote
    /// counts 2, another control character 6), default and cap WASMBOX_RESULT_BYTES (80,000,
    /// the whole answer included). file_download: bytes of the file, default and cap
    /// WASMBOX_DOWNLOAD_BYTES (4 MiB).
    #[serde(default, deserialize_with = "lenient_opt")]
    pub max_bytes: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
pub struct FileWriteArgs {
    pub sandbox_id: String,
    pub path: String,
    /// UTF-8 text.
    pub content: String,
}

#[derive(Deserialize, JsonSchema)]
pub struct FileUploadArgs {
    pub sandbox_id: String,
    pub path: String,
    /// The file's bytes, base64-encoded.
    pub content_base64: String,
}

fn default_workspace() -> String {
    WORKSPACE_GUEST.into()
}
fn default_max_files() -> i64 {
    1000
}

#[derive(Deserialize, JsonSchema)]
pub struct FileListArgs {
    pub sandbox_id: String,
    #[serde(default = "default_workspace")]
    pub path: String,
    /// At most this many entries (<= 0: all).
    #[serde(default = "default_max_files", deserialize_with = "lenient")]
    pub max_results: i64,
}

/// A window of a text file (file_read).
#[derive(Serialize, JsonSchema)]
pub struct FileText {
    pub path: String,
    /// The file's size in bytes.
    pub size_bytes: u64,
    pub offset: u64,
    /// More follows: pass next_offset as offset to go on.
    pub truncated: bool,
    pub next_offset: u64,
    pub content: String,
}

/// A window of a file's bytes (file_download).
#[derive(Serialize, JsonSchema)]
pub struct FileBytes {
    pub path: String,
    pub content_base64: String,
    /// Bytes returned.
    pub size: usize,
    /// The file's size in bytes.
    pub size_bytes: u64,
    pub offset: u64,
    pub truncated: bool,
    pub next_offset: u64,
    /// A whole image file (PNG, JPEG, GIF, WebP, by its bytes) also comes as the image block
    /// at `content_index`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRef>,
}

#[derive(Serialize, JsonSchema)]
pub struct ImageRef {
    #[serde(rename = "type")]
    pub mime: String,
    pub content_index: usize,
}

/// A file written (file_write, file_upload).
#[derive(Serialize, JsonSchema)]
pub struct FileWritten {
    pub path: String,
    /// file_write: characters (as HOPX counts); file_upload: bytes.
    pub size: usize,
    /// file_write: bytes of UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<usize>,
}

/// A directory's entries (file_list).
#[derive(Serialize, JsonSchema)]
pub struct FileListing {
    pub path: String,
    pub count: usize,
    /// name, path, size, is_dir, modified_time...
    pub files: Vec<Value>,
    /// Cut short by max_results or the answer's budget.
    pub truncated: bool,
    /// null when truncated.
    pub total_files: Option<usize>,
}

/// file_exists, file_remove, file_mkdir.
#[derive(Serialize, JsonSchema)]
pub struct FileStatus {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exists: Option<bool>,
    /// removed or created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

impl WasmboxServer {
    /// The file tools whose answers may take more than `WASMBOX_RESULT_BYTES`, by tool.
    pub(super) fn file_budgets() -> Vec<(String, Budget)> {
        vec![(
            Self::file_download_tool_attr().name.into(),
            Budget::Download,
        )]
    }
}

#[tool_router(router = file_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "file_read",
        title = "Read a text file",
        description = "Read a UTF-8 text file of a sandbox's /workspace, from offset (bytes, default 0), at most max_bytes (default and cap: the answer budget, 80,000 bytes), cut at a character boundary. Returns content, size_bytes (the file's size), offset, truncated (more follows) and next_offset (pass it as offset to go on).",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn file_read(
        &self,
        Parameters(a): Parameters<ReadArgs>,
    ) -> Result<Json<FileText>, ToolError> {
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => {
                let budget = self.wasmbox.config().result_bytes;
                let work = async {
                    let text = c.sandbox.read_file(&a.path).await?;
                    Ok(cloud_text_window(a, &text, budget))
                };
                return self.in_cloud("file_read", &c, work).await;
            }
        };
        let room = text_room(&a, self.wasmbox.config().result_bytes);
        on_disk(move || {
            let (p, w) = sb
                .fs
                .read_text(&a.path, a.offset.unwrap_or(0), room)
                .map_err(|e| file_error("file_read", &a.path, &e))?;
            Ok(Json::new(FileText {
                path: p.guest().into(),
                size_bytes: w.size,
                offset: w.offset,
                truncated: w.truncated,
                next_offset: w.next_offset(),
                content: w.data,
            }))
        })
        .await
    }

    #[tool(
        name = "file_download",
        title = "Download a file",
        description = "Read a file of a sandbox's /workspace as base64, from offset (bytes, default 0), at most max_bytes (default and cap 4 MiB). Returns content_base64, size (bytes returned), size_bytes (the file's size), offset, truncated (more follows) and next_offset.",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn file_download(
        &self,
        Parameters(a): Parameters<ReadArgs>,
    ) -> Result<Json<FileBytes>, ToolError> {
        let sb = self.local_sandbox(&a.sandbox_id, "sandbox_id", "file_download")?;
        let cap = self.wasmbox.config().download_bytes;
        let max = a.max_bytes.map_or(cap, |m| m.min(cap as u64) as usize);
        on_disk(move || {
            let (p, w) = sb
                .fs
                .read_bytes(&a.path, a.offset.unwrap_or(0), max)
                .map_err(|e| file_error("file_download", &a.path, &e))?;
            let b64 = base64::engine::general_purpose::STANDARD.encode(&w.data);
            let whole = w.offset == 0 && !w.truncated;
            // An image also goes out as an image block, which clients show.
            let image = crate::lang::images::download_image(&w.data, whole, b64.len());
            let reply = Json::new(FileBytes {
                path: p.guest().into(),
                content_base64: b64.clone(),
                size: w.data.len(),
                size_bytes: w.size,
                offset: w.offset,
                truncated: w.truncated,
                next_offset: w.next_offset(),
                image: image.map(|mime| ImageRef {
                    mime: mime.into(),
                    content_index: 1,
                }),
            });
            Ok(reply.with_images(image.map(|mime| (b64, mime.to_string()))))
        })
        .await
    }

    #[tool(
        name = "file_write",
        title = "Write a text file",
        description = "Write a UTF-8 text file in a sandbox's /workspace (parents are created). size is in characters.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn file_write(
        &self,
        Parameters(a): Parameters<FileWriteArgs>,
    ) -> Result<Json<FileWritten>, ToolError> {
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => {
                let work = async {
                    c.sandbox.write_file(&a.path, &a.content).await?;
                    Ok(json!({"path": a.path, "size": a.content.chars().count()}))
                };
                return self.in_cloud("file_write", &c, work).await;
            }
        };
        on_disk(move || {
            let p = sb
                .fs
                .write(&a.path, a.content.as_bytes())
                .map_err(|e| file_error("file_write", &a.path, &e))?;
            // HOPX counts characters.
            Ok(Json::new(FileWritten {
                path: p.guest().into(),
                size: a.content.chars().count(),
                bytes: Some(a.content.len()),
            }))
        })
        .await
    }

    #[tool(
        name = "file_upload",
        title = "Upload a file",
        description = "Write binary content (base64) to a file in a sandbox's /workspace.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn file_upload(
        &self,
        Parameters(a): Parameters<FileUploadArgs>,
    ) -> Result<Json<FileWritten>, ToolError> {
        let sb = self.local_sandbox(&a.sandbox_id, "sandbox_id", "file_upload")?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(a.content_base64.trim())
            .map_err(|e| {
                ToolError::message(
                    "Invalid arguments",
                    format!("content_base64 is not valid base64: {e}"),
                )
                .with("path", &a.path)
            })?;
        on_disk(move || {
            let p = sb
                .fs
                .write(&a.path, &bytes)
                .map_err(|e| file_error("file_upload", &a.path, &e))?;
            Ok(Json::new(FileWritten {
                path: p.guest().into(),
                size: bytes.len(),
                bytes: None,
            }))
        })
        .await
    }

    #[tool(
        name = "file_list",
        title = "List a directory",
        description = "List a directory of a sandbox's /workspace.",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn file_list(
        &self,
        Parameters(a): Parameters<FileListArgs>,
    ) -> Result<Json<FileListing>, ToolError> {
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => {
                let budget = self.wasmbox.config().result_bytes;
                let work = async {
                    let files = c.sandbox.list_files(&a.path).await?;
                    let mut v = json!(listing(&a.path, &files, a.max_results));
                    fit_list(&mut v, "files", budget);
                    Ok(v)
                };
                return self.in_cloud("file_list", &c, work).await;
            }
        };
        let budget = self.wasmbox.config().result_bytes;
        on_disk(move || {
            let (p, files) = sb
                .fs
                .list(&a.path)
                .map_err(|e| file_error("file_list", &a.path, &e))?;
            let list = listing(p.guest(), &files, a.max_results);
            Ok(Json::fitted(list, |v| fit_list(v, "files", budget)))
        })
        .await
    }

    #[tool(
        name = "file_exists",
        title = "Check a path",
        description = "Whether a path exists in a sandbox's /workspace.",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn file_exists(
        &self,
        Parameters(a): Parameters<PathArgs>,
    ) -> Result<Json<FileStatus>, ToolError> {
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => {
                let work = async {
                    let exists = c.sandbox.file_exists(&a.path).await?;
                    Ok(json!({"path": a.path, "exists": exists}))
                };
                return self.in_cloud("file_exists", &c, work).await;
            }
        };
        on_disk(move || {
            let (p, exists) = sb
                .fs
                .exists(&a.path)
                .map_err(|e| file_error("file_exists", &a.path, &e))?;
            Ok(Json::new(FileStatus {
                path: p.guest().into(),
                exists: Some(exists),
                status: None,
            }))
        })
        .await
    }

    #[tool(
        name = "file_remove",
        title = "Remove a file or directory",
        description = "Remove a file or a directory (recursively) from a sandbox's /workspace.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn file_remove(
        &self,
        Parameters(a): Parameters<PathArgs>,
    ) -> Result<Json<FileStatus>, ToolError> {
        self.path_op(PathOp::Remove, a).await
    }

    #[tool(
        name = "file_mkdir",
        title = "Create a directory",
        description = "Create a directory (and its parents) in a sandbox's /workspace.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn file_mkdir(
        &self,
        Parameters(a): Parameters<PathArgs>,
    ) -> Result<Json<FileStatus>, ToolError> {
        self.path_op(PathOp::Mkdir, a).await
    }
}

/// What file_remove and file_mkdir do to a path.
#[derive(Clone, Copy)]
enum PathOp {
    Remove,
    Mkdir,
}

impl PathOp {
    /// The tool, and the status its answer reports.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            PathOp::Remove => ("file_remove", "removed"),
            PathOp::Mkdir => ("file_mkdir", "created"),
        }
    }
}

impl WasmboxServer {
    async fn path_op(&self, op: PathOp, a: PathArgs) -> Result<Json<FileStatus>, ToolError> {
        let (tool, done) = op.names();
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => {
                let work = async {
                    match op {
                        PathOp::Remove => c.sandbox.remove_file(&a.path).await?,
                        PathOp::Mkdir => c.sandbox.mkdir(&a.path).await?,
                    }
                    Ok(json!({"status": done, "path": a.path}))
                };
                return self.in_cloud(tool, &c, work).await;
            }
        };
        on_disk(move || {
            let p = match op {
                PathOp::Remove => sb.fs.remove(&a.path),
                PathOp::Mkdir => sb.fs.mkdir(&a.path),
            }
            .map_err(|e| file_error(tool, &a.path, &e))?;
            Ok(status(p.guest().into(), done))
        })
        .await
    }
}

/// A directory's entries as file_list answers, local or cloud: at most `max_results`, within
/// the answer's budget.
fn listing<F: Serialize>(path: &str, files: &[F], max: i64) -> FileListing {
    let (count, truncated, total_files) = shown(max, files.len());
    FileListing {
        path: path.into(),
        count,
        files: files.iter().take(count).map(|f| json!(f)).collect(),
        truncated,
        total_files,
    }
}

fn status(path: String, status: &str) -> Json<FileStatus> {
    Json::new(FileStatus {
        path,
        exists: None,
        status: Some(status.into()),
    })
}

/// A file tool's failure in HOPX's shape.
pub fn file_error(tool: &str, path: &str, e: &FsError) -> ToolError {
    let error = match e {
        FsError::NotFound(_) => "File not found".to_string(),
        FsError::Escape(_) | FsError::SymlinkEscape(_) => "Path not allowed".to_string(),
        FsError::Quota { .. } | FsError::MountFull { .. } => "Disk quota exceeded".to_string(),
        _ => format!(
            "Failed to {}",
            match tool {
                "file_read" | "file_download" => "read file",
                "file_write" | "file_upload" => "write file",
                "file_list" => "list files",
                "file_exists" => "check file existence",
                "file_remove" => "remove file",
                _ => "create directory",
            }
        ),
    };
    ToolError::both(error, e).with("path", path)
}

/// The bytes of JSON text a file_read's content may take: `max_bytes` within the budget, less
/// the rest of the answer (the guest path at its longest, the numbers at their widest).
pub fn text_room(a: &ReadArgs, budget: usize) -> usize {
    let frame = pretty(&json!({
        "path": format!("{WORKSPACE_GUEST}/{}", a.path),
        "content": "",
        "size_bytes": u64::MAX,
        "offset": u64::MAX,
        "truncated": false,
        "next_offset": u64::MAX,
    }))
    .len();
    let max = a
        .max_bytes
        .map_or(budget, |m| m.min(budget as u64) as usize);
    max.min(budget.saturating_sub(frame))
}

/// A cloud file's text in the window a local one would get (the HOPX agent sends it whole).
fn cloud_text_window(a: ReadArgs, content: &str, budget: usize) -> Value {
    let start = a.offset.unwrap_or(0).min(content.len() as u64) as usize;
    let at_boundary = content.is_char_boundary(start);
    let room = text_room(&a, budget);
    let (skip, text, truncated) =
        crate::sandbox::fs::text_window(&content.as_bytes()[start..], at_boundary, true, room)
            .unwrap_or((0, "", false));
    json!({
        "path": a.path,
        "size_bytes": content.len(),
        "offset": start + skip,
        "truncated": truncated,
        "next_offset": start + skip + text.len(),
        "content": text,
    })
}
