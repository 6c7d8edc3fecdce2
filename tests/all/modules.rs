//! A missing Python module gets a note naming what is bundled and how to get more.

use crate::common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn a_missing_module_gets_a_note_on_what_is_bundled() {
    let c = server().await;
    let r = py(&c, "import definitely_not_a_module_xyz").await;
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("ModuleNotFoundError"),
        "{r}"
    );
    let notes = r["notes"].to_string();
    assert!(notes.contains("'definitely_not_a_module_xyz'"), "{notes}");
    assert!(
        notes.contains("numpy") && notes.contains("HOPX_API_KEY"),
        "{notes}"
    );
    // In a sandbox too; a run that imports what is bundled has no such note.
    let id = create_sandbox(&c, json!({})).await;
    let r = ok(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": "import seaborn, sklearn\nimport nope_not_here"}),
    )
    .await;
    assert!(r["notes"].to_string().contains("'nope_not_here'"), "{r}");
    let r = py(&c, "import numpy, pandas\nprint('fine')").await;
    assert_eq!(r["stdout"], "fine\n");
    assert!(!r["notes"].to_string().contains("not in wasmbox"), "{r}");
    c.cancel().await.unwrap();
}
