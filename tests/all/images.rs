//! Images without asking (issue #23): the matplotlib figures a Python run leaves open or shows
//! come back as MCP image blocks, in one-shots and sandbox turns alike, found in the same turn
//! and handed to the host through the guest's door (never its output), bounded by
//! `WASMBOX_IMAGES` and `WASMBOX_IMAGE_BYTES`; `file_download` of an image adds an image block.

use crate::common;

use base64::Engine as _;
use common::*;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

/// The image blocks of an answer, decoded: (MIME type, bytes).
fn images(r: &CallToolResult) -> Vec<(String, Vec<u8>)> {
    r.content
        .iter()
        .filter_map(|c| c.as_image())
        .map(|i| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(&i.data)
                .expect("image data is base64");
            (i.mime_type.clone(), bytes)
        })
        .collect()
}

/// Checks every block is a PNG of a real figure, and that the text says how many there are.
fn check_pngs(r: &CallToolResult, n: usize) -> Value {
    assert!(!is_error(r), "{:?}", r.content.first());
    let v = object(r);
    let imgs = images(r);
    assert_eq!(imgs.len(), n, "{v}");
    for (mime, png) in &imgs {
        assert_eq!(mime, "image/png");
        assert!(png.starts_with(PNG_MAGIC), "a valid PNG");
        assert!(png.len() > 1000, "a rendered figure, {} bytes", png.len());
    }
    if n > 0 {
        assert_eq!(v["images"], n, "the text block names the images: {v}");
    } else {
        assert!(v.get("images").is_none(), "{v}");
    }
    v
}

async fn one_shot(c: &Client, code: &str) -> CallToolResult {
    call(
        c,
        "execute_code",
        json!({"code": code, "language": "python"}),
    )
    .await
}

async fn turn(c: &Client, id: &str, mode: &str, code: &str) -> CallToolResult {
    call(
        c,
        "execute_code",
        json!({"mode": mode, "sandbox_id": id, "code": code}),
    )
    .await
}

const PLOT: &str = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\n";

#[tokio::test]
async fn a_one_shot_returns_its_open_figures_as_png_images() {
    let c = server().await;
    // Without plt.show: the figure left open at the end.
    let v = check_pngs(&one_shot(&c, &format!("{PLOT}print('done')")).await, 1);
    assert_eq!(v["stdout"], "done\n");
    assert_eq!(v["stderr"], "");
    // With plt.show: the same figure, once.
    let v = check_pngs(
        &one_shot(&c, &format!("{PLOT}plt.show()\nprint('shown')")).await,
        1,
    );
    assert_eq!(v["stdout"], "shown\n");
    assert_eq!(v["stderr"], "", "plt.show() is quiet");
    // plt.show() counts as a notebook's does: each shown figure is one image, even if the same
    // figure number is drawn again after it, or everything is closed before the end.
    let r = one_shot(
        &c,
        "import matplotlib.pyplot as plt\n\
         for i in range(2):\n    plt.plot([0, i])\n    plt.show()\n\
         plt.close('all')",
    )
    .await;
    check_pngs(&r, 2);
    // An isolated run in a sandbox's files returns them too.
    let id = create_sandbox(&c, json!({})).await;
    let r = call(
        &c,
        "execute_code",
        json!({"mode": "isolated", "sandbox_id": id, "code": PLOT}),
    )
    .await;
    check_pngs(&r, 1);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn runs_without_figures_return_no_image() {
    let c = server().await;
    for code in [
        "print(1 + 1)",
        "import numpy as np\nprint(np.arange(3).sum())",
        // pyplot imported, nothing plotted; and a figure closed before the end.
        "import matplotlib.pyplot as plt\nprint('none')",
        "import matplotlib.pyplot as plt\nplt.figure()\nplt.close('all')",
        // A failing run with no figure.
        "raise ValueError('nope')",
    ] {
        let r = one_shot(&c, code).await;
        check_pngs(&r, 0);
    }
    // A run that fails after plotting still returns what it drew, with its traceback.
    let r = one_shot(&c, &format!("{PLOT}raise ValueError('after the plot')")).await;
    let v = check_pngs(&r, 1);
    assert!(
        v["stderr"].as_str().unwrap().contains("after the plot"),
        "{v}"
    );
    assert_eq!(v["exit_code"], 1);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_sandbox_turn_returns_its_figure_once() {
    let c = server().await;
    let id = create_sandbox(&c, json!({})).await;
    let r = turn(
        &c,
        &id,
        "persistent",
        &format!("{PLOT}fig = plt.gcf()\n'plotted'"),
    )
    .await;
    let v = check_pngs(&r, 1);
    assert!(v["stdout"].as_str().unwrap().contains("plotted"), "{v}");
    // Closed after capture: the next turn, which plots nothing, sends nothing; the session
    // (and the figure object it keeps) lives on.
    let r = turn(&c, &id, "persistent", "print(type(fig).__name__)").await;
    let v = check_pngs(&r, 0);
    assert_eq!(v["stdout"], "Figure\n");
    // The named tool works the same.
    let r = call(
        &c,
        "execute_code_persistent",
        json!({"sandbox_id": id, "code": "plt.figure(); plt.bar([1, 2], [3, 4])"}),
    )
    .await;
    check_pngs(&r, 1);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn printed_output_cannot_pass_for_an_image() {
    let c = server().await;
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    // What the door's frames, the rich reply and an MCP image block look like, printed to
    // stdout and stderr as text and as bytes.
    let code = format!(
        "import sys, base64, json\n\
         png = base64.b64decode('{png}')\n\
         sys.stdout.buffer.write(b'wasmbox:png\\n' + png + b'\\n')\n\
         sys.stderr.buffer.write(b'wasmbox:png\\n' + png + b'\\n')\n\
         sys.stdout.flush(); sys.stderr.flush()\n\
         print(json.dumps({{'outputs': [{{'type': 'image/png', 'data': '{png}'}}], 'notes': []}}))\n\
         print(json.dumps({{'type': 'image', 'data': '{png}', 'mimeType': 'image/png'}}))\n"
    );
    let r = one_shot(&c, &code).await;
    let v = check_pngs(&r, 0);
    assert!(v["stdout"].as_str().unwrap().contains("wasmbox:png"), "{v}");
    let id = create_sandbox(&c, json!({})).await;
    for mode in ["persistent", "rich"] {
        let r = turn(&c, &id, mode, &code).await;
        check_pngs(&r, 0);
    }
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn figures_over_the_bounds_are_dropped_with_a_note() {
    let c = server().await;
    let r = one_shot(
        &c,
        "import matplotlib.pyplot as plt\nfor i in range(7):\n    plt.figure()\n    plt.plot([0, i])",
    )
    .await;
    let v = check_pngs(&r, 4);
    let notes = v["notes"].to_string();
    assert!(notes.contains("3 figure(s) not returned"), "{notes}");
    assert!(notes.contains("WASMBOX_IMAGES"), "{notes}");
    assert!(
        notes.contains("savefig") && notes.contains("file_download"),
        "{notes}"
    );
    c.cancel().await.unwrap();
    // The bytes: a budget smaller than one figure returns none, and says why.
    let c = server_with_env(&[("WASMBOX_IMAGE_BYTES", "2000")]).await;
    let r = one_shot(&c, PLOT).await;
    let v = check_pngs(&r, 0);
    assert!(
        v["notes"].to_string().contains("1 figure(s) not returned"),
        "{v}"
    );
    c.cancel().await.unwrap();
    // WASMBOX_IMAGES=0: figures are left alone (and plt.show() is a no-op again).
    let c = server_with_env(&[("WASMBOX_IMAGES", "0")]).await;
    let r = one_shot(
        &c,
        &format!("{PLOT}plt.show()\nprint(len(plt.get_fignums()))"),
    )
    .await;
    let v = check_pngs(&r, 0);
    assert_eq!(v["stdout"], "1\n");
    assert!(v.get("notes").is_none(), "{v}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn rich_mode_returns_each_figure_once_with_its_table() {
    let c = server().await;
    let id = create_sandbox(&c, json!({})).await;
    let r = turn(
        &c,
        &id,
        "rich",
        &format!("{PLOT}plt.show()\nplt.figure()\nplt.plot([3, 2, 1])\nimport pandas as pd\npd.DataFrame({{'a': [1, 2]}})"),
    )
    .await;
    let v = check_pngs(&r, 2);
    let outs = v["rich_outputs"].as_array().unwrap();
    let types: Vec<&str> = outs.iter().map(|o| o["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["image/png", "image/png", "text/html"], "{v}");
    assert_eq!(outs[0]["metadata"]["content_index"], 1);
    assert_eq!(outs[1]["metadata"]["content_index"], 2);
    // Rich mode shares the one budget: more figures than the count, the rest noted.
    let r = turn(
        &c,
        &id,
        "rich",
        "for i in range(6):\n    plt.figure()\n    plt.plot([0, i])",
    )
    .await;
    let v = check_pngs(&r, 4);
    assert_eq!(v["rich_outputs"].as_array().unwrap().len(), 4, "{v}");
    assert!(
        v["notes"].to_string().contains("2 figure(s) not returned"),
        "{v}"
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn file_download_of_an_image_adds_an_image_block() {
    let c = server().await;
    let id = create_sandbox(&c, json!({})).await;
    // Saved, then closed: the turn itself returns no image.
    let r = turn(
        &c,
        &id,
        "persistent",
        &format!(
            "{PLOT}plt.savefig('/workspace/plot.png')\nplt.savefig('/workspace/plot.data', format='png')\nplt.close('all')\nopen('/workspace/fake.png', 'w').write('not an image')"
        ),
    )
    .await;
    check_pngs(&r, 0);
    // By content: a PNG named .data is an image, a text file named .png is not.
    for (path, image) in [
        ("/workspace/plot.png", true),
        ("/workspace/plot.data", true),
        ("/workspace/fake.png", false),
    ] {
        let r = call(&c, "file_download", json!({"sandbox_id": id, "path": path})).await;
        assert!(!is_error(&r), "{:?}", r.content.first());
        let v = object(&r);
        let file = base64::engine::general_purpose::STANDARD
            .decode(v["content_base64"].as_str().unwrap())
            .unwrap();
        let imgs = images(&r);
        if image {
            assert_eq!(imgs, [("image/png".to_string(), file)], "{path}");
            assert_eq!(v["image"]["type"], "image/png", "{v}");
        } else {
            assert!(imgs.is_empty(), "{path}");
            assert!(v.get("image").is_none(), "{v}");
        }
    }
    // A window of an image is not an image.
    let r = call(
        &c,
        "file_download",
        json!({"sandbox_id": id, "path": "/workspace/plot.png", "max_bytes": 100}),
    )
    .await;
    assert!(images(&r).is_empty());
    c.cancel().await.unwrap();
}
