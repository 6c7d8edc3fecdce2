//! The local templates: which languages a sandbox runs.

use crate::lang::Language;

/// A local template: which languages its sandboxes run.
#[derive(Debug)]
pub struct Template {
    pub id: &'static str,
    pub description: &'static str,
    pub languages: &'static [Language],
}

const PY_DESC: &str = "Python 3.15 (WASI) with numpy, pandas, scipy, scikit-learn and matplotlib, run locally in WebAssembly";

/// The templates that exist locally; anything else is a cloud template.
pub static TEMPLATES: &[Template] = &[
    Template {
        id: "code-interpreter",
        description: "Python 3.15 (numpy, pandas, scipy, scikit-learn, matplotlib), JavaScript (QuickJS-NG) and Go (standard library, built for wasip1), run locally in WebAssembly",
        languages: &[Language::Python, Language::JavaScript, Language::Go],
    },
    Template {
        id: "python",
        description: PY_DESC,
        languages: &[Language::Python],
    },
    Template {
        id: "javascript",
        description: "JavaScript (QuickJS-NG 0.16, ES2023) with console, timers, process and a small fs module, run locally in WebAssembly",
        languages: &[Language::JavaScript],
    },
    Template {
        id: "go",
        description: "Go (standard library) built for GOOS=wasip1 by a real Go toolchain and run locally in WebAssembly",
        languages: &[Language::Go],
    },
];

pub fn template(name: &str) -> Option<&'static Template> {
    TEMPLATES.iter().find(|t| t.id == name)
}
