//! Where a request runs: locally in WebAssembly when it can, in the HOPX cloud when it needs
//! something the local sandbox does not have (a shell, the network, a cloud-only template).

use std::fmt;

use super::config::CloudConfig;
use super::error::CloudError;
use crate::lang::Language;

/// Templates the local sandbox serves; any other name exists only in the cloud.
pub const LOCAL_TEMPLATES: &[&str] = &["code-interpreter", "python", "javascript", "go"];

/// What a caller asked for, as far as routing cares. Unset fields never force the cloud.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteRequest<'a> {
    pub language: Option<&'a str>,
    /// A command line (`run_command`), as the user wrote it.
    pub command: Option<&'a str>,
    pub template: Option<&'a str>,
    pub internet_access: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Local,
    Cloud { reason: CloudReason },
}

/// Why a request needs the cloud; its `Display` is the subject of the user-facing messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloudReason {
    /// `bash`, `sh` or `shell` as the language.
    Shell {
        language: String,
    },
    /// A command line the local sandbox cannot run without a shell.
    Command {
        command: String,
        why: String,
    },
    InternetAccess,
    Template {
        name: String,
    },
    /// A direct call of the cloud API (sandbox creation, a file read, ...).
    Request {
        what: &'static str,
    },
}

impl fmt::Display for CloudReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloudReason::Shell { language } => write!(f, "{language}"),
            CloudReason::Command { command, why } => {
                write!(f, "the command `{}` ({why})", shorten(command, 80))
            }
            CloudReason::InternetAccess => write!(f, "internet access"),
            CloudReason::Template { name } => write!(f, "the template '{name}' (cloud only)"),
            CloudReason::Request { what } => write!(f, "{what}"),
        }
    }
}

fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// The pure decision, with no configuration: where this request has to run.
pub fn decide(req: &RouteRequest<'_>) -> Location {
    if let Some(name) = req.template.map(str::trim).filter(|t| !t.is_empty())
        && !LOCAL_TEMPLATES.contains(&name.to_ascii_lowercase().as_str())
    {
        return Location::Cloud {
            reason: CloudReason::Template { name: name.into() },
        };
    }
    if req.internet_access {
        return Location::Cloud {
            reason: CloudReason::InternetAccess,
        };
    }
    if let Some(lang) = req.language
        && let Ok(Language::Bash) = Language::parse(lang)
    {
        return Location::Cloud {
            reason: CloudReason::Shell {
                language: lang.trim().to_ascii_lowercase(),
            },
        };
    }
    if let Some(cmd) = req.command
        && let CommandClass::NeedsShell(why) = classify_command(cmd)
    {
        return Location::Cloud {
            reason: CloudReason::Command {
                command: cmd.trim().into(),
                why,
            },
        };
    }
    Location::Local
}

/// [`decide`], then the cloud's availability: a request that needs the cloud fails here, before
/// any network I/O, when there is no API key or the cloud is turned off.
pub fn route(req: &RouteRequest<'_>, cfg: &CloudConfig) -> Result<Location, CloudError> {
    let loc = decide(req);
    if let Location::Cloud { reason } = &loc {
        cfg.check_available(reason)?;
    }
    Ok(loc)
}

/// A command line, as the local sandbox sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandClass {
    Local(LocalCommand),
    /// Needs a real shell; the string says why, for messages.
    NeedsShell(String),
}

/// A command the local runtimes can run directly: one interpreter, one program, plain args.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalCommand {
    pub language: Language,
    pub program: Program,
    pub args: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Program {
    /// A source file in the sandbox's working directory.
    File(String),
    /// Inline code (`python -c`, `node -e`).
    Code(String),
}

/// Classifies a command line: only `python|python3 FILE.py|-c CODE`, `node FILE.js|-e CODE` and
/// `go run FILE.go` (each with plain arguments) run locally. Anything a shell would interpret
/// (pipes, redirections, `$`, globs, `;`, `&&`, env assignments, ...) or any other program needs a
/// shell, so it goes to the cloud; when in doubt, it is a shell command.
pub fn classify_command(cmd: &str) -> CommandClass {
    let shell = |why: &str| CommandClass::NeedsShell(why.to_string());
    if let Some(meta) = shell_syntax(cmd) {
        return CommandClass::NeedsShell(format!("it uses shell syntax: {meta}"));
    }
    let Some(words) = shlex::split(cmd) else {
        return shell("it has unbalanced quotes");
    };
    let Some((prog, rest)) = words.split_first() else {
        return shell("it is empty");
    };
    let local = |language, program, args: &[String]| {
        CommandClass::Local(LocalCommand {
            language,
            program,
            args: args.to_vec(),
        })
    };
    match (prog.as_str(), rest) {
        ("python" | "python3", [flag, code, args @ ..]) if flag == "-c" => {
            local(Language::Python, Program::Code(code.clone()), args)
        }
        ("python" | "python3", [file, args @ ..]) if is_source(file, ".py") => {
            local(Language::Python, Program::File(file.clone()), args)
        }
        ("node", [flag, code, args @ ..]) if flag == "-e" || flag == "--eval" => {
            local(Language::JavaScript, Program::Code(code.clone()), args)
        }
        ("node", [file, args @ ..]) if is_source(file, ".js") || is_source(file, ".mjs") => {
            local(Language::JavaScript, Program::File(file.clone()), args)
        }
        ("go", [run, file, args @ ..]) if run == "run" && is_source(file, ".go") => {
            local(Language::Go, Program::File(file.clone()), args)
        }
        ("python" | "python3" | "node" | "go", _) => {
            shell("only a source file or inline code runs locally, without other options")
        }
        _ => CommandClass::NeedsShell(format!(
            "`{}` is not python, node or go, so it needs a shell",
            shorten(prog, 40)
        )),
    }
}

fn is_source(word: &str, ext: &str) -> bool {
    word.len() > ext.len() && word.ends_with(ext) && !word.starts_with('-')
}

/// The first character a shell would interpret rather than pass on literally, if any. Single
/// quotes make everything literal; double quotes still expand `$`, `` ` `` and `\`.
fn shell_syntax(cmd: &str) -> Option<String> {
    #[derive(PartialEq)]
    enum Q {
        None,
        Single,
        Double,
    }
    let mut q = Q::None;
    let mut word_start = true;
    let mut first_word = true;
    let mut chars = cmd.chars().peekable();
    while let Some(c) = chars.next() {
        match q {
            Q::Single => {
                if c == '\'' {
                    q = Q::None;
                }
                continue;
            }
            Q::Double => {
                match c {
                    '"' => q = Q::None,
                    '$' | '`' => return Some(format!("`{c}` (expansion)")),
                    '\\' => {
                        chars.next();
                    }
                    _ => {}
                }
                continue;
            }
            Q::None => {}
        }
        let at_start = word_start;
        word_start = false;
        match c {
            '\'' => q = Q::Single,
            '"' => q = Q::Double,
            '\\' => return Some("`\\` (escape)".into()),
            ' ' | '\t' => {
                word_start = true;
                if !at_start {
                    first_word = false;
                }
            }
            '\n' | '\r' => return Some("a newline (several commands)".into()),
            '|' | '&' | ';' | '<' | '>' | '(' | ')' | '$' | '`' | '*' | '?' | '[' | '{' => {
                return Some(format!("`{c}`"));
            }
            '#' | '~' if at_start => return Some(format!("`{c}`")),
            '=' if first_word => return Some("an environment assignment".into()),
            _ => {}
        }
    }
    match q {
        Q::None => None,
        _ => Some("an unbalanced quote".into()),
    }
}
