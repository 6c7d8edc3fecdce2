//! Arguments more than one tool group takes, and how arguments are read: leniently, as HOPX's
//! pydantic does in lax mode ("2" is a number, "false" a bool, a JSON string an object), since
//! clients such as the MCP Inspector CLI send every value as a string.

use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

#[derive(Deserialize, JsonSchema)]
pub struct IdArgs {
    /// The sandbox id.
    pub id: String,
}

#[derive(Deserialize, JsonSchema)]
pub struct SandboxArgs {
    /// The sandbox id (from create_sandbox).
    pub sandbox_id: String,
}

#[derive(Deserialize, JsonSchema)]
pub struct OptionalSandboxArgs {
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

/// The languages and aliases `language` takes, for the schema; parsing stays a string so that
/// an unknown one gets wasmbox's own error, which says what exists.
pub fn language_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "enum": ["python", "python3", "py", "javascript", "js", "node", "nodejs", "go", "golang",
                 "bash", "sh", "shell"],
        "default": "python",
    })
}

pub fn default_language() -> String {
    "python".into()
}

/// A value that may come as itself or as a string holding it.
fn lax<'de, D: Deserializer<'de>, T: DeserializeOwned>(v: Value) -> Result<T, D::Error> {
    let v = match v {
        Value::String(s) => {
            let t = s.trim();
            match t.to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" => Value::Bool(true),
                "false" | "no" | "off" => Value::Bool(false),
                _ => serde_json::from_str(t).unwrap_or(Value::String(s)),
            }
        }
        v => v,
    };
    T::deserialize(v).map_err(D::Error::custom)
}

/// A number, a bool or an object, or a string holding one.
pub fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<T, D::Error> {
    lax::<D, T>(Value::deserialize(d)?)
}

/// As [`lenient`], where null means absent.
pub fn lenient_opt<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    d: D,
) -> Result<Option<T>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        v => lax::<D, T>(v).map(Some),
    }
}

/// Environment variables, as an object or a string holding one.
pub type Env = Option<BTreeMap<String, String>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct A {
        #[serde(default, deserialize_with = "lenient_opt")]
        t: Option<f64>,
        #[serde(default, deserialize_with = "lenient_opt")]
        n: Option<i64>,
        #[serde(default, deserialize_with = "lenient_opt")]
        b: Option<bool>,
        #[serde(default, deserialize_with = "lenient_opt")]
        env: Env,
    }

    fn a(v: Value) -> Result<A, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn strings_hold_numbers_bools_and_objects() {
        let x = a(serde_json::json!({"t": "2.5", "n": "7", "b": "false", "env": "{\"K\":\"v\"}"}))
            .unwrap();
        assert_eq!(
            (x.t, x.n, x.b, x.env.unwrap()["K"].as_str()),
            (Some(2.5), Some(7), Some(false), "v")
        );
        let x = a(serde_json::json!({"t": 3, "n": null})).unwrap();
        assert_eq!((x.t, x.n, x.b), (Some(3.0), None, None));
        assert!(a(serde_json::json!({"n": "seven"})).is_err());
        assert!(a(serde_json::json!({"n": "2.5"})).is_err());
        assert!(a(serde_json::json!({"env": "[1]"})).is_err());
    }
}
