//! A snippet as the toolchain sees it: `package main` and `func main` added where the snippet
//! leaves them out, with line directives so errors name the snippet's own lines.

/// A snippet that imports cgo (at `line`, from 1), refused as the toolchain would word it.
#[derive(Debug, thiserror::Error)]
#[error(
    "./main.go:{line}:1: cgo (import \"C\") is not supported: wasmbox builds Go for \
     GOOS=wasip1 with CGO_ENABLED=0; use only the standard library\n"
)]
pub struct CgoRefused {
    pub line: usize,
}

/// The file the toolchain builds: the snippet itself when it has a `package` clause; otherwise
/// `package main` is added (and, when it has no `func` declarations at all, its statements are
/// wrapped in `func main`), with `/*line*/` directives so positions still name the snippet's
/// own lines and columns. cgo is refused.
pub fn prepare_source(code: &str) -> std::result::Result<String, CgoRefused> {
    let lines: Vec<&str> = code.lines().collect();
    let mut in_import_block = false;
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim();
        if t.starts_with("import (") {
            in_import_block = true;
        } else if in_import_block && t.starts_with(')') {
            in_import_block = false;
        }
        let cgo = t == "import \"C\""
            || t.starts_with("import \"C\" ")
            || t.starts_with("import \"C\"//")
            || (in_import_block && (t == "\"C\"" || t.starts_with("\"C\" ")));
        if cgo {
            return Err(CgoRefused { line: i + 1 });
        }
    }
    if has_package_clause(&lines) {
        return Ok(code.to_string());
    }
    let has_func = lines.iter().any(|l| l.starts_with("func "));
    if has_func {
        return Ok(format!("package main;/*line main.go:1:1*/{code}"));
    }
    // Leading imports, comments and blank lines stay at top level; the rest goes in main().
    let mut body_start = lines.len();
    let mut block = false;
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim();
        if block {
            if t.starts_with(')') {
                block = false;
            }
            continue;
        }
        if t.is_empty() || t.starts_with("//") {
            continue;
        }
        if t.starts_with("import (") || t == "import(" {
            block = !t.contains(')');
            continue;
        }
        if t.starts_with("import ") {
            continue;
        }
        body_start = i;
        break;
    }
    let header: String = lines[..body_start]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    let body: String = lines[body_start..]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    Ok(format!(
        "package main;/*line main.go:1:1*/{header}func main() {{/*line main.go:{}:1*/{body}}}\n",
        body_start + 1
    ))
}

/// Whether the first token outside comments is `package`.
fn has_package_clause(lines: &[&str]) -> bool {
    let mut in_block = false;
    for l in lines {
        let mut t = l.trim();
        if in_block {
            match t.find("*/") {
                Some(i) => {
                    in_block = false;
                    t = t[i + 2..].trim();
                }
                None => continue,
            }
        }
        while t.starts_with("/*") {
            match t.find("*/") {
                Some(i) => t = t[i + 2..].trim(),
                None => {
                    in_block = true;
                    t = "";
                }
            }
        }
        if t.is_empty() || t.starts_with("//") {
            continue;
        }
        return t.starts_with("package ") || t.starts_with("package\t");
    }
    false
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_prepared() {
        let full = "// c\npackage main\nfunc main() {}\n";
        assert_eq!(prepare_source(full).unwrap(), full);
        let funcs = "import \"fmt\"\nfunc main() { fmt.Println(1) }";
        assert_eq!(
            prepare_source(funcs).unwrap(),
            format!("package main;/*line main.go:1:1*/{funcs}")
        );
        let stmts = "import \"fmt\"\n\nx := 2\nfmt.Println(x)";
        assert_eq!(
            prepare_source(stmts).unwrap(),
            "package main;/*line main.go:1:1*/import \"fmt\"\n\nfunc main() {/*line main.go:3:1*/x := 2\nfmt.Println(x)\n}\n"
        );
        assert!(prepare_source("import \"C\"\nfunc main() {}").is_err());
        assert!(prepare_source("package main\nimport (\n\t\"fmt\"\n\t\"C\"\n)\n").is_err());
    }
}
