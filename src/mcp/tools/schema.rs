//! Output schemas in the form that is cheapest for a client to check every result against.
//!
//! Clients check each result against its tool's output schema (the Python SDK with `jsonschema`,
//! the TypeScript SDK with Ajv). schemars writes a nullable enum as `anyOf: [{$ref}, {type:
//! null}]` over a `oneOf` of `const`s; checking `null` against that builds an error per branch
//! before the `null` branch matches, which was most of the Python SDK's 0.3 ms per one-shot. The
//! same constraints written as one `type` list and one `enum` are checked without an error.
//! [`quick_to_check`] rewrites only into equivalent forms: a schema accepts the same values
//! before and after (formats JSON Schema does not define are annotations, and dropped).

use serde_json::{Map, Value};

/// `schema` with its `$defs` inlined (where they do not refer on), `oneOf`s of constants as
/// `enum`s, and `anyOf: [S, {type: null}]` as `S` with `null` added to its type.
pub fn quick_to_check(schema: &Map<String, Value>) -> Map<String, Value> {
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut out = Value::Object(schema.clone());
    rewrite(&mut out, &defs, 0);
    let mut out = match out {
        Value::Object(m) => m,
        _ => unreachable!("an object stays an object"),
    };
    // Defs still referred to (recursive ones) stay; the rest are gone from the tree.
    let text = serde_json::to_string(&out).unwrap_or_default();
    if let Some(Value::Object(d)) = out.get_mut("$defs") {
        d.retain(|name, _| text.contains(&format!("\"#/$defs/{name}\"")));
        if d.is_empty() {
            out.remove("$defs");
        }
    }
    out
}

/// The formats JSON Schema defines. schemars adds Rust's own (`uint64`, `double`), which
/// validators ignore after a warning each (Ajv prints one per schema it compiles).
const FORMATS: [&str; 19] = [
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// How deep a `$ref` is followed: schemars' defs nest a few levels; a recursive def stops here.
const MAX_DEPTH: usize = 8;

fn rewrite(v: &mut Value, defs: &Map<String, Value>, depth: usize) {
    match v {
        Value::Array(items) => items.iter_mut().for_each(|i| rewrite(i, defs, depth)),
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                match k.as_str() {
                    // Maps of names to schemas: each value is one.
                    "properties" | "patternProperties" | "dependentSchemas" => {
                        if let Value::Object(named) = child {
                            named.values_mut().for_each(|s| rewrite(s, defs, depth));
                        }
                    }
                    // Values, not schemas; the defs are rewritten where they are inlined.
                    "$defs" | "enum" | "const" | "default" | "examples" | "required" => {}
                    _ => rewrite(child, defs, depth),
                }
            }
            if m.get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| !FORMATS.contains(&f))
            {
                m.remove("format");
            }
            inline_ref(m, defs, depth);
            enum_of_consts(m);
            nullable(m);
        }
        _ => {}
    }
}

/// `{$ref: "#/$defs/X", ...}` as X's keywords beside the node's own (the node's win: they are
/// annotations such as `description`).
fn inline_ref(m: &mut Map<String, Value>, defs: &Map<String, Value>, depth: usize) {
    let Some(Value::String(r)) = m.get("$ref") else {
        return;
    };
    let Some(Value::Object(def)) = r.strip_prefix("#/$defs/").and_then(|n| defs.get(n)) else {
        return;
    };
    if depth >= MAX_DEPTH {
        return;
    }
    let mut def = Value::Object(def.clone());
    rewrite(&mut def, defs, depth + 1);
    let Value::Object(def) = def else { return };
    if def.contains_key("$ref") || def.keys().any(|k| m.contains_key(k) && k != "description") {
        return;
    }
    m.remove("$ref");
    for (k, v) in def {
        m.entry(k).or_insert(v);
    }
}

/// `oneOf` of branches that are each one constant (of the type the branch names, with a
/// description at most) is `enum` of those constants: distinct constants cannot match twice.
/// The branches' descriptions go into the node's.
fn enum_of_consts(m: &mut Map<String, Value>) {
    let Some(Value::Array(branches)) = m.get("oneOf") else {
        return;
    };
    let mut consts = Vec::new();
    let mut said = Vec::new();
    let mut types = Vec::new();
    for b in branches {
        let Some(b) = b.as_object() else { return };
        if b.keys()
            .any(|k| !matches!(k.as_str(), "const" | "type" | "description"))
        {
            return;
        }
        let Some(c) = b.get("const") else { return };
        let typed = match (b.get("type").and_then(Value::as_str), c) {
            (None, _) => true,
            (Some("string"), Value::String(_)) | (Some("boolean"), Value::Bool(_)) => true,
            (Some("null"), Value::Null) => true,
            (Some("integer"), Value::Number(n)) => n.is_i64() || n.is_u64(),
            (Some("number"), Value::Number(_)) => true,
            _ => false,
        };
        if !typed || consts.contains(c) {
            return;
        }
        if let Some(Value::String(d)) = b.get("description") {
            said.push(format!(
                "{}: {d}",
                c.as_str().map_or(c.to_string(), str::to_string)
            ));
        }
        consts.push(c.clone());
        types.push(b.get("type").cloned());
    }
    m.remove("oneOf");
    m.insert("enum".into(), Value::Array(consts));
    // One type named by every branch is the node's (the constants have it anyway).
    if let Some(Some(t)) = types.first()
        && types.iter().all(|u| u.as_ref() == Some(t))
    {
        m.entry("type").or_insert(t.clone());
    }
    if !said.is_empty() {
        let mut d = m
            .get("description")
            .and_then(Value::as_str)
            .map(|d| format!("{d} "))
            .unwrap_or_default();
        d.push_str(&said.join(" "));
        m.insert("description".into(), Value::String(d));
    }
}

/// `anyOf: [S, {type: null}]` (either order), where S names one type and has no keyword that
/// applies to every type but `enum`, is S with `null` among its types (and in its `enum`).
fn nullable(m: &mut Map<String, Value>) {
    let Some(Value::Array(branches)) = m.get("anyOf") else {
        return;
    };
    if branches.len() != 2 {
        return;
    }
    let is_null = |b: &Value| *b == serde_json::json!({"type": "null"});
    let s = match (is_null(&branches[0]), is_null(&branches[1])) {
        (false, true) => &branches[0],
        (true, false) => &branches[1],
        _ => return,
    };
    let Some(s) = s.as_object() else { return };
    const EVERY_TYPE: [&str; 9] = [
        "const", "$ref", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
    ];
    let Some(Value::String(t)) = s.get("type") else {
        return;
    };
    if EVERY_TYPE.iter().any(|k| s.contains_key(*k))
        || s.keys().any(|k| m.contains_key(k) && k != "description")
    {
        return;
    }
    let mut s = s.clone();
    s.insert("type".into(), serde_json::json!([t, "null"]));
    if let Some(Value::Array(e)) = s.get_mut("enum") {
        e.push(Value::Null);
    }
    m.remove("anyOf");
    for (k, v) in s {
        m.entry(k).or_insert(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quick(v: Value) -> Value {
        Value::Object(quick_to_check(v.as_object().unwrap()))
    }

    #[test]
    fn a_nullable_enum_becomes_one_type_list_and_one_enum() {
        let s = json!({
            "$defs": {"Hit": {"description": "Which limit.", "oneOf": [
                {"const": "timeout", "type": "string", "description": "a"},
                {"const": "memory", "type": "string", "description": "b"}]}},
            "type": "object",
            "properties": {"limit": {"anyOf": [{"$ref": "#/$defs/Hit"}, {"type": "null"}],
                                     "description": "Why it stopped."}},
        });
        assert_eq!(
            quick(s),
            json!({"type": "object", "properties": {"limit": {
                "description": "Why it stopped.",
                "enum": ["timeout", "memory", null],
                "type": ["string", "null"]}}})
        );
    }

    #[test]
    fn what_cannot_be_rewritten_the_same_stays() {
        // Two non-null branches; a const beside null; a recursive def.
        let s = json!({
            "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
            "properties": {
                "a": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "b": {"anyOf": [{"const": "x"}, {"type": "null"}]},
                "n": {"$ref": "#/$defs/Node"},
            },
        });
        let q = quick(s.clone());
        assert_eq!(q["properties"]["a"], s["properties"]["a"]);
        assert_eq!(q["properties"]["b"], s["properties"]["b"]);
        assert!(q["$defs"].get("Node").is_some(), "{q}");
    }

    #[test]
    fn every_output_schema_keeps_its_properties_and_loses_its_nullable_refs() {
        for tool in super::super::WasmboxServer::router().list_all() {
            let Some(s) = tool.output_schema.as_deref() else {
                continue;
            };
            let q = quick_to_check(s);
            assert_eq!(
                s.get("properties").map(|p| p.as_object().unwrap().len()),
                q.get("properties").map(|p| p.as_object().unwrap().len()),
                "{}",
                tool.name
            );
            let text = serde_json::to_string(&q).unwrap();
            assert!(
                !text.contains(r#"{"type":"null"}"#),
                "{}: {text}",
                tool.name
            );
        }
    }
}
