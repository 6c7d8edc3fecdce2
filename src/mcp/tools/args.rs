//! Arguments more than one tool group takes, and how arguments are read: leniently, as HOPX's
//! pydantic does in lax mode ("2" is a number, "false" a bool, a JSON string an object), since
//! clients such as the MCP Inspector CLI send every value as a string.

use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use rmcp::RoleServer;
use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::ErrorCode;
use rmcp::service::RequestContext;

/// A tool's arguments, read as rmcp's own `Parameters` reads them (the `#[tool]` macro takes
/// its input schema from any type of this name). A call made by [`parse_only`] stops here once
/// they parse, so that the router itself tells whether a tool's arguments parse, without
/// running the tool and without a table of tools and argument types to keep up to date.
pub struct Parameters<T>(pub T);

impl<T: JsonSchema> JsonSchema for Parameters<T> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        T::json_schema(g)
    }
}

impl<S, T: DeserializeOwned> FromContextPart<ToolCallContext<'_, S>> for Parameters<T> {
    fn from_context_part(context: &mut ToolCallContext<S>) -> Result<Self, rmcp::ErrorData> {
        let rmcp::handler::server::wrapper::Parameters(v) =
            rmcp::handler::server::wrapper::Parameters::from_context_part(context)?;
        if context
            .request_context
            .extensions
            .get::<ParseOnly>()
            .is_some()
        {
            return Err(rmcp::ErrorData::new(PARSED, "the arguments parse", None));
        }
        Ok(Parameters(v))
    }
}

/// Marks a call that only parses its arguments ([`parse_only`]).
#[derive(Clone, Copy)]
struct ParseOnly;

/// What a parse-only call answers once the arguments parse; no call of a client's sees it.
const PARSED: ErrorCode = ErrorCode(-32_099);

/// A call's request context made to stop once its arguments parse.
pub fn parse_only(mut context: RequestContext<RoleServer>) -> RequestContext<RoleServer> {
    context.extensions.insert(ParseOnly);
    context
}

/// Whether a parse-only call's failure is only that its arguments parsed.
pub fn parsed(e: &rmcp::ErrorData) -> bool {
    e.code == PARSED
}

/// A tool that reads no arguments: any object does.
#[derive(Deserialize)]
pub struct NoArgs {}

impl JsonSchema for NoArgs {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "NoArgs".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "object", "properties": {}})
    }
}

/// A sandbox named by HOPX's `id` or by `sandbox_id`, as every other sandbox tool takes it.
#[derive(Deserialize)]
#[serde(try_from = "EitherId")]
pub struct IdArgs {
    pub id: String,
}

#[derive(Deserialize)]
struct EitherId {
    id: Option<String>,
    sandbox_id: Option<String>,
}

/// Why `id` and `sandbox_id` do not name one sandbox.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    #[error("id {id:?} and sandbox_id {other:?} name different sandboxes: give one")]
    Different { id: String, other: String },
    #[error("missing field `id` (the sandbox id; `sandbox_id` also does)")]
    Missing,
}

impl TryFrom<EitherId> for IdArgs {
    type Error = IdError;

    fn try_from(a: EitherId) -> Result<Self, IdError> {
        match (a.id, a.sandbox_id) {
            (Some(id), Some(other)) if id != other => Err(IdError::Different { id, other }),
            (Some(id), _) | (None, Some(id)) => Ok(Self { id }),
            (None, None) => Err(IdError::Missing),
        }
    }
}

impl JsonSchema for IdArgs {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IdArgs".into()
    }

    /// Neither is `required`: one of the two is, which the parse checks, since a top-level
    /// `anyOf` is refused by some model APIs' tool schemas.
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "The sandbox id (or give sandbox_id)."},
                "sandbox_id": {"type": "string", "description": "The sandbox id, as the other sandbox tools name it (an alias of id)."},
            },
        })
    }
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
