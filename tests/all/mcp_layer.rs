//! What `tools/list` declares and what the tools then send: titles, annotations, input schemas
//! (the language enum, numeric bounds), output schemas that every answer meets, arguments as
//! clients that send only strings give them, and HOPX's prompt.

use crate::common;

use std::collections::BTreeMap;

use common::*;
use rmcp::model::{GetPromptRequestParams, Tool};
use serde_json::{Value, json};

/// `v` against the parts of JSON Schema the output schemas use: `type` (one or several),
/// `required`, `properties`, `additionalProperties`, `items`, `$ref` into `$defs`, `anyOf`/`oneOf`.
fn check(schema: &Value, root: &Value, v: &Value, at: &str) -> Result<(), String> {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or_default();
        let def = &root["$defs"][name];
        return check(def, root, v, at);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(alts) = schema.get(key).and_then(Value::as_array)
            && !alts.iter().any(|s| check(s, root, v, at).is_ok())
        {
            return Err(format!("{at}: {v} matches none of {key}"));
        }
    }
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let fits = |t: &str| match t {
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "array" => v.is_array(),
            "object" => v.is_object(),
            "null" => v.is_null(),
            _ => true,
        };
        if !types.iter().any(|t| fits(t)) {
            return Err(format!("{at}: {v} is not of type {t}"));
        }
    }
    if let (Some(required), Some(obj)) = (
        schema.get("required").and_then(Value::as_array),
        v.as_object(),
    ) {
        for k in required.iter().filter_map(Value::as_str) {
            if !obj.contains_key(k) {
                return Err(format!("{at}: required `{k}` missing from {v}"));
            }
        }
    }
    if let (Some(props), Some(obj)) = (
        schema.get("properties").and_then(Value::as_object),
        v.as_object(),
    ) {
        for (k, s) in props {
            if let Some(x) = obj.get(k) {
                check(s, root, x, &format!("{at}.{k}"))?;
            }
        }
    }
    // A map's values (`get_system_metrics`' figures: name -> samples).
    if let (Some(extra), Some(obj)) = (
        schema.get("additionalProperties").filter(|s| s.is_object()),
        v.as_object(),
    ) {
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, x) in obj
            .iter()
            .filter(|(k, _)| props.is_none_or(|p| !p.contains_key(*k)))
        {
            check(extra, root, x, &format!("{at}.{k}"))?;
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        for (i, x) in arr.iter().enumerate() {
            check(items, root, x, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

/// Calls `tool`, which must succeed, and checks its answer against the tool's output schema.
async fn typed(c: &Client, tools: &BTreeMap<String, Tool>, tool: &str, args: Value) -> Value {
    let v = ok(c, tool, args).await;
    let schema = Value::Object(
        (*tools[tool]
            .output_schema
            .clone()
            .unwrap_or_else(|| panic!("{tool} has no output schema")))
        .clone(),
    );
    if let Err(e) = check(&schema, &schema, &v, tool) {
        panic!("{tool}'s answer does not meet its output schema: {e}\nschema: {schema}");
    }
    v
}

#[tokio::test]
async fn every_tool_declares_itself_and_answers_in_its_declared_shape() {
    // Three background runs at once (a job, a command, an async run) with a 2-core machine's
    // default of two per client.
    let c = server_with_env(&[
        ("WASMBOX_MAX_JOBS", "8"),
        ("WASMBOX_MAX_JOBS_PER_TOKEN", "8"),
    ])
    .await;
    let list = c.list_all_tools().await.unwrap();
    let tools: BTreeMap<String, Tool> = list.into_iter().map(|t| (t.name.to_string(), t)).collect();
    // The server's own router is the list: nothing here to keep up to date.
    assert_eq!(tools.keys().cloned().collect::<Vec<_>>(), {
        let mut names = wasmbox::mcp::WasmboxServer::tool_names();
        names.sort();
        names
    });
    for (name, t) in &tools {
        assert!(
            t.title.as_deref().is_some_and(|s| !s.is_empty()),
            "{name}: no title"
        );
        let a = t
            .annotations
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: no annotations"));
        assert!(a.read_only_hint.is_some(), "{name}: no read-only hint");
        let url = name == "get_preview_url" || name == "get_agent_url";
        assert!(url || t.output_schema.is_some(), "{name}: no output schema");
        if let Some(s) = &t.output_schema {
            assert_eq!(s["type"], "object", "{name}: output schema not an object");
        }
    }
    let ro = |n: &str| tools[n].annotations.as_ref().unwrap().read_only_hint;
    assert_eq!(ro("file_read"), Some(true));
    assert_eq!(ro("list_sandboxes"), Some(true));
    assert_eq!(ro("delete_sandbox"), Some(false));
    let destructive = |n: &str| tools[n].annotations.as_ref().unwrap().destructive_hint;
    assert_eq!(destructive("delete_sandbox"), Some(true));
    assert_eq!(destructive("execute_code_isolated"), Some(false));
    // The language is an enum in the schema, aliases included; numbers carry their bounds.
    let exec = &tools["execute_code"].input_schema;
    let lang = &exec["properties"]["language"];
    let langs = lang["enum"].as_array().expect("language enum");
    for l in ["python", "javascript", "js", "go", "bash"] {
        assert!(langs.contains(&json!(l)), "{l} missing from {lang}");
    }
    assert_eq!(lang["default"], "python");
    assert!(
        exec["properties"]["timeout"]["maximum"].is_number(),
        "{exec:?}"
    );

    // Every tool, called as an assistant would: each answer meets its schema.
    let one = typed(&c, &tools, "execute_code", json!({"code": "print(6 * 7)"})).await;
    assert_eq!(one["stdout"], "42\n");
    typed(
        &c,
        &tools,
        "execute_code_isolated",
        json!({"code": "console.log(1)", "language": "js"}),
    )
    .await;
    let sb = typed(&c, &tools, "create_sandbox", json!({})).await;
    let id = sb["id"].as_str().unwrap().to_string();
    let s = |extra: Value| {
        let mut v = json!({"sandbox_id": id});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    typed(
        &c,
        &tools,
        "execute_code_persistent",
        s(json!({"code": "x = 41"})),
    )
    .await;
    let r = typed(
        &c,
        &tools,
        "execute_code",
        s(json!({"code": "x + 1", "mode": "persistent"})),
    )
    .await;
    assert_eq!(r["stdout"], "42\n");
    typed(&c, &tools, "execute_code_rich", s(json!({"code": "x"}))).await;
    let bg = typed(
        &c,
        &tools,
        "execute_code_background",
        s(json!({"code": "import time; time.sleep(30)"})),
    )
    .await;
    typed(&c, &tools, "execute_list_processes", s(json!({}))).await;
    typed(&c, &tools, "list_processes", s(json!({}))).await;
    typed(
        &c,
        &tools,
        "execute_kill_process",
        s(json!({"process_id": bg["process_id"]})),
    )
    .await;
    typed(
        &c,
        &tools,
        "run_command",
        s(json!({"command": "python -c 'print(1)'"})),
    )
    .await;
    typed(
        &c,
        &tools,
        "run_command_background",
        s(json!({"command": "python -c 'print(1)'"})),
    )
    .await;
    typed(
        &c,
        &tools,
        "execute_code_async",
        s(json!({"code": "1", "callback_url": "http://127.0.0.1:9/cb"})),
    )
    .await;
    typed(
        &c,
        &tools,
        "file_write",
        s(json!({"path": "a.txt", "content": "hi"})),
    )
    .await;
    typed(
        &c,
        &tools,
        "file_upload",
        s(json!({"path": "b.bin", "content_base64": "AAE="})),
    )
    .await;
    typed(&c, &tools, "file_read", s(json!({"path": "a.txt"}))).await;
    typed(&c, &tools, "file_download", s(json!({"path": "b.bin"}))).await;
    typed(&c, &tools, "file_list", s(json!({}))).await;
    typed(&c, &tools, "file_exists", s(json!({"path": "a.txt"}))).await;
    typed(&c, &tools, "file_mkdir", s(json!({"path": "d"}))).await;
    typed(&c, &tools, "file_remove", s(json!({"path": "d"}))).await;
    typed(&c, &tools, "env_set", s(json!({"env_vars": {"K": "v"}}))).await;
    let env = typed(&c, &tools, "env_get", s(json!({}))).await;
    assert_eq!(env, json!({"env_vars": {"K": "v"}}));
    typed(&c, &tools, "env_clear", s(json!({}))).await;
    typed(&c, &tools, "ping_vm", s(json!({}))).await;
    typed(&c, &tools, "get_vm_info", s(json!({}))).await;
    typed(&c, &tools, "get_system_metrics", s(json!({}))).await;
    typed(&c, &tools, "list_sandboxes", json!({})).await;
    typed(&c, &tools, "get_sandbox", json!({"id": id})).await;
    typed(
        &c,
        &tools,
        "update_sandbox_timeout",
        json!({"id": id, "timeout_seconds": 120}),
    )
    .await;
    typed(&c, &tools, "pause_sandbox", json!({"id": id})).await;
    typed(&c, &tools, "resume_sandbox", json!({"id": id})).await;
    typed(&c, &tools, "health", json!({})).await;
    typed(&c, &tools, "cache_stats", json!({})).await;
    typed(&c, &tools, "cache_clear", json!({})).await;
    typed(&c, &tools, "list_templates", json!({})).await;
    typed(
        &c,
        &tools,
        "get_template",
        json!({"name": "code-interpreter"}),
    )
    .await;
    typed(&c, &tools, "delete_sandbox", json!({"id": id})).await;
    // The two URL tools have nothing to give locally: an error that says why.
    let e = err(&c, "get_agent_url", json!({"sandbox_id": "nope"})).await;
    assert_eq!(e["error"], "Sandbox not found");
    c.cancel().await.unwrap();
}

/// The MCP Inspector CLI sends every `--tool-arg` as a string; HOPX's server (pydantic, lax)
/// takes "2" as 2, "true" as true and a JSON string as an object, and so does wasmbox.
#[tokio::test]
async fn numbers_bools_and_objects_may_come_as_strings() {
    let c = server().await;
    let r = ok(
        &c,
        "execute_code",
        json!({"code": "import os; print(os.environ['K'])\n7 * 6", "timeout": "2", "echo": "true",
               "env": "{\"K\": \"from a string\"}"}),
    )
    .await;
    assert_eq!(r["stdout"], "from a string\n42\n");
    let r = ok(
        &c,
        "execute_code",
        json!({"code": "while True: pass", "timeout": "1"}),
    )
    .await;
    assert_eq!(r["limit"], "timeout");
    let id = create_sandbox(&c, json!({"timeout_seconds": "120"})).await;
    let v = ok(&c, "get_sandbox", json!({"id": id})).await;
    assert_eq!(v["timeout_seconds"], 120);
    let v = ok(&c, "list_sandboxes", json!({"limit": "1"})).await;
    assert_eq!(v["count"], 1);
    // Not a number, and not one of the right kind: the tool's error, saying which field.
    let e = err(&c, "execute_code", json!({"code": "1", "timeout": "soon"})).await;
    assert!(e["message"].as_str().unwrap().contains("invalid"), "{e}");
    let e = err(
        &c,
        "update_sandbox_timeout",
        json!({"id": id, "timeout_seconds": "2.5"}),
    )
    .await;
    assert_eq!(e["error"], "Invalid arguments");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn hopx_prompt_is_served() {
    let c = server().await;
    let prompts = c.list_all_prompts().await.unwrap();
    assert_eq!(prompts.len(), 1);
    assert_eq!(prompts[0].name, "quick_code_execution");
    let p = c
        .get_prompt(GetPromptRequestParams::new("quick_code_execution"))
        .await
        .unwrap();
    let text = serde_json::to_string(&p.messages).unwrap();
    for want in ["execute_code", "persistent", "create_sandbox", "javascript"] {
        assert!(text.contains(want), "{want} missing from the prompt");
    }
    assert!(
        c.get_prompt(GetPromptRequestParams::new("nope"))
            .await
            .is_err()
    );
    c.cancel().await.unwrap();
}

/// An error answers in its text block alone: the TypeScript SDK (the MCP Inspector CLI) checks
/// any `structuredContent` against the tool's output schema, errors included, and reported our
/// not-found as "-32602: Structured content does not match the tool's output schema".
#[tokio::test]
async fn errors_carry_no_structured_content() {
    let c = server().await;
    for (tool, args) in [
        ("get_sandbox", json!({"id": "bogus"})),
        ("delete_snapshot", json!({"snapshot_id": "../../etc"})),
        ("execute_code", json!({"code": "1", "language": "cobol"})),
        ("file_read", json!({"sandbox_id": "nope", "path": "a"})),
    ] {
        let r = call(&c, tool, args).await;
        assert!(is_error(&r), "{tool}: {:?}", r.content);
        assert!(
            r.structured_content.is_none(),
            "{tool}: {:?}",
            r.structured_content
        );
        let v = object(&r);
        assert!(v["error"].is_string(), "{tool}: {v}");
    }
}
