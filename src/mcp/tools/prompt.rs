//! HOPX's one prompt, `quick_code_execution`, so that users moving from HOPX keep it: a guide
//! to `execute_code`, here with what runs locally.

pub const NAME: &str = "quick_code_execution";

pub const DESCRIPTION: &str =
    "How to run code with execute_code: the modes, the languages, sandboxes and examples.";

pub const TEXT: &str = "\
Run code with the execute_code tool. It has four modes:

- isolated (default): a one-shot in a fresh WebAssembly sandbox with an empty /workspace, no \
network and no host environment, discarded afterwards. Do not pass sandbox_id.
  execute_code(code=\"import numpy as np; print(np.arange(5).sum())\")
- persistent: runs in a sandbox's live session, so variables, imports and files persist between \
calls; a final expression is echoed like a notebook cell. Needs sandbox_id from create_sandbox.
  create_sandbox() -> {\"id\": \"...\"}
  execute_code(code=\"import pandas as pd; df = pd.DataFrame({'a': [1, 2]})\", mode=\"persistent\", sandbox_id=\"...\")
  execute_code(code=\"df.a.sum()\", mode=\"persistent\", sandbox_id=\"...\")
- rich: persistent, and matplotlib figures come back as PNG images and a final DataFrame as HTML.
- background: returns a process_id at once; follow it with execute_list_processes and stop it \
with execute_kill_process. For work longer than the client's request timeout.

Languages: python (numpy, pandas, scipy, scikit-learn, matplotlib, seaborn, statsmodels, sympy \
and more; no pip), javascript (QuickJS: ES2023, no npm), go (standard library; a snippet without \
a package clause is wrapped) run locally; bash runs in the HOPX cloud when HOPX_API_KEY is set.

Limits: timeout in seconds (default 30, max 300; background up to 3600), memory, output and disk. \
Results carry stdout, stderr, exit_code, execution_time and success, plus limit, truncated and \
notes when there is something to say. Sandboxes live timeout_seconds (default 600) and are then \
removed with their files; one-shots are removed at once. Files: file_write, file_read, file_list, \
file_upload, file_download. Per-call env is better than env_set for one-off values.";
