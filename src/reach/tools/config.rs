//! `--mcp-config FILE` / `WASMBOX_MCP_CONFIG`: the MCP servers whose tools guest code may call,
//! in the `mcpServers` form Claude Desktop, Claude Code and Cursor use, plus what wasmbox adds
//! per server: `allow` (tool names, or `"*"`; absent: the tools the server marks read-only) and
//! `confirm` (whether a destructive tool needs the person's consent; `true` unless set).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The setting that names the file.
pub const MCP_CONFIG: &str = "WASMBOX_MCP_CONFIG";

/// How wasmbox reaches one server.
#[derive(Clone, Debug, PartialEq)]
pub enum Transport {
    /// A child process speaking MCP on its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    /// Streamable HTTP.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// Which of a server's tools code may call.
#[derive(Clone, Debug, PartialEq)]
pub enum Allow {
    /// The tools the server annotates read-only (`readOnlyHint`): the default.
    ReadOnly,
    All,
    Names(Vec<String>),
}

impl Allow {
    pub fn admits(&self, tool: &str, read_only: bool) -> bool {
        match self {
            Allow::ReadOnly => read_only,
            Allow::All => true,
            Allow::Names(n) => n.iter().any(|n| n == tool),
        }
    }
}

/// One configured server.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// The name as configured (the key under `mcpServers`).
    pub key: String,
    /// The name code uses: `tools.<name>`, the key with every character that is not a letter,
    /// a digit or `_` made `_`.
    pub name: String,
    pub transport: Transport,
    pub allow: Allow,
    pub confirm: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(rename = "mcpServers")]
    mcp_servers: BTreeMap<String, Entry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    allow: Option<AllowField>,
    confirm: Option<bool>,
    #[serde(default)]
    disabled: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum AllowField {
    One(String),
    Many(Vec<String>),
}

/// Why the file could not be read, naming it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{MCP_CONFIG}: cannot read {}: {why}", path.display())]
    Read { path: PathBuf, why: std::io::Error },
    #[error("{MCP_CONFIG}: {}: {why}", path.display())]
    Bad { path: PathBuf, why: BadConfig },
}

/// What is wrong in a config's text, naming the server.
#[derive(Debug, thiserror::Error)]
pub enum BadConfig {
    #[error("not an mcpServers file: {0}")]
    NotMcpServers(serde_json::Error),
    #[error(
        "server {key:?}: its name in code ({name}) is over {MAX_NAME} characters; shorten the key"
    )]
    LongName { key: String, name: String },
    #[error("servers {other:?} and {key:?} would both be tools.{name} in code: rename one")]
    SameName {
        other: String,
        key: String,
        name: String,
    },
    #[error(
        "server {0:?}: the legacy SSE transport is not supported; use streamable HTTP (\"type\": \"http\") or stdio"
    )]
    Sse(String),
    #[error("server {key:?}: url {url:?} is not an http(s) URL")]
    NotHttp { key: String, url: String },
    #[error("server {0:?} has both command and url: give one")]
    Both(String),
    #[error("server {0:?} has neither command nor url")]
    Neither(String),
    #[error("server {key:?}: type {kind:?} does not fit what it gives")]
    Misfit { key: String, kind: String },
}

/// Reads and checks the file; every error names the file and the server.
pub fn load(path: &Path) -> Result<Vec<ServerSpec>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|why| ConfigError::Read {
        path: path.to_path_buf(),
        why,
    })?;
    parse(&text).map_err(|why| ConfigError::Bad {
        path: path.to_path_buf(),
        why,
    })
}

/// Checks a config's text.
pub fn parse(text: &str) -> Result<Vec<ServerSpec>, BadConfig> {
    let file: File = serde_json::from_str(text).map_err(BadConfig::NotMcpServers)?;
    let mut out: Vec<ServerSpec> = Vec::new();
    for (key, e) in file.mcp_servers {
        if e.disabled {
            continue;
        }
        let name = ident(&key);
        if name.len() > MAX_NAME {
            return Err(BadConfig::LongName { key, name });
        }
        if let Some(other) = out.iter().find(|s| s.name == name) {
            return Err(BadConfig::SameName {
                other: other.key.clone(),
                key,
                name,
            });
        }
        let transport = match (e.command, e.url, e.kind.as_deref()) {
            (_, _, Some("sse")) => {
                return Err(BadConfig::Sse(key));
            }
            (Some(command), None, None | Some("stdio")) => Transport::Stdio {
                command,
                args: e.args,
                env: e.env,
                cwd: e.cwd,
            },
            (None, Some(url), None | Some("http" | "streamable-http" | "streamableHttp")) => {
                match reqwest::Url::parse(&url) {
                    Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                    _ => return Err(BadConfig::NotHttp { key, url }),
                }
                Transport::Http {
                    url,
                    headers: e.headers,
                }
            }
            (Some(_), Some(_), _) => {
                return Err(BadConfig::Both(key));
            }
            (None, None, _) => {
                return Err(BadConfig::Neither(key));
            }
            (_, _, Some(t)) => {
                return Err(BadConfig::Misfit {
                    key,
                    kind: t.to_string(),
                });
            }
        };
        let allow = match e.allow {
            None => Allow::ReadOnly,
            Some(AllowField::One(s)) if s == "*" => Allow::All,
            Some(AllowField::One(s)) => Allow::Names(vec![s]),
            Some(AllowField::Many(v)) if v.iter().any(|s| s == "*") => Allow::All,
            Some(AllowField::Many(v)) => Allow::Names(v),
        };
        out.push(ServerSpec {
            key,
            name,
            transport,
            allow,
            confirm: e.confirm.unwrap_or(true),
        });
    }
    Ok(out)
}

/// `s` as an identifier in Python and JavaScript: letters, digits and single `_`s, starting
/// with a letter. With no `__` in it, a server's name is always what comes before the first
/// `__` of its tools' protocol names.
pub fn ident(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let c = if c.is_ascii_alphanumeric() { c } else { '_' };
        if !(c == '_' && out.ends_with('_')) {
            out.push(c);
        }
    }
    if !out.starts_with(|c: char| c.is_ascii_alphabetic()) {
        out.insert_str(0, "t_");
    }
    out
}

/// The longest server name code may use: its tools' protocol names (at most 64 characters)
/// keep room for the tool's.
pub const MAX_NAME: usize = 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_desktop_form_with_allow_and_confirm() {
        let s = parse(
            r#"{"mcpServers": {
                "git-hub": {"command": "npx", "args": ["-y", "x"], "env": {"T": "1"}},
                "notes": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"A": "b"},
                          "allow": ["*"], "confirm": false},
                "off": {"command": "x", "disabled": true},
                "one": {"command": "y", "allow": ["read", "write"]}
            }}"#,
        )
        .unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].name, "git_hub");
        assert_eq!(ident("a--b__c"), "a_b_c");
        assert_eq!(ident("9lives"), "t_9lives");
        assert_eq!(s[0].allow, Allow::ReadOnly);
        assert!(s[0].confirm);
        assert_eq!(s[1].allow, Allow::All);
        assert!(!s[1].confirm);
        assert!(matches!(&s[1].transport, Transport::Http { url, .. } if url.ends_with("/mcp")));
        assert!(s[2].allow.admits("write", false) && !s[2].allow.admits("drop", true));
    }

    #[test]
    fn bad_entries_are_named() {
        for (text, says) in [
            (r#"{"mcpServers": {"a": {}}}"#, "neither"),
            (
                r#"{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}"#,
                "both",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "file:///etc"}}}"#,
                "not an http",
            ),
            (
                r#"{"mcpServers": {"a": {"type": "sse", "url": "http://h"}}}"#,
                "SSE",
            ),
            (
                r#"{"mcpServers": {"a-b": {"command": "x"}, "a_b": {"command": "y"}}}"#,
                "rename",
            ),
            (r#"{"servers": {}}"#, "mcpServers"),
            (
                r#"{"mcpServers": {"a-very-long-server-name-indeed": {"command": "x"}}}"#,
                "over 24",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
