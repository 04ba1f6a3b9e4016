//! The structured-output fields of a request, one of which it may set: OpenAI's
//! `response_format`, vLLM's `structured_outputs` and `guided_*`, llama-server's `grammar` and
//! `json_schema`, each read into the [`Grammar`] the runtime compiles.

use serde_json::Value;
use spindle_runtime::Grammar;

use crate::error::ApiError;

/// The structured-output fields, one of which a request may set: OpenAI's `response_format`,
/// vLLM's `structured_outputs` and `guided_*`, llama-server's `grammar` and `json_schema`.
/// Returns the grammar and the field that set it.
pub fn structured_output(body: &Value) -> Result<Option<(String, Grammar)>, ApiError> {
    let mut found: Vec<(String, Grammar)> = Vec::new();
    let field = |name: &str| body.get(name).filter(|v| !v.is_null());
    let string = |name: &str, v: &Value| -> Result<String, ApiError> {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| ApiError::invalid(name, format!("{name} must be a string")))
    };
    // A schema given as an object, or as a string holding one (vLLM accepts both).
    let schema = |name: &str, v: &Value| -> Result<Grammar, ApiError> {
        let parsed = match v {
            Value::String(s) => serde_json::from_str(s).map_err(|e| {
                ApiError::invalid(name, format!("{name} is not a valid JSON schema: {e}"))
            })?,
            other => other.clone(),
        };
        if !parsed.is_object() && !parsed.is_boolean() {
            return Err(ApiError::invalid(
                name,
                format!("{name} must be a JSON schema object"),
            ));
        }
        Ok(Grammar::JsonSchema(parsed))
    };
    let choice = |name: &str, v: &Value| -> Result<Grammar, ApiError> {
        let list = v
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|c| c.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
            })
            .filter(|l| !l.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(name, format!("{name} must be a non-empty list of strings"))
            })?;
        Ok(Grammar::Choice(list))
    };
    if let Some(format) = field("response_format") {
        let kind = format.get("type").and_then(Value::as_str);
        match kind {
            Some("text") => {}
            Some("json_object") => found.push((
                "response_format".into(),
                // llama-server's extension: a schema beside the type.
                match format.get("schema") {
                    Some(s) => schema("response_format.schema", s)?,
                    None => Grammar::JsonObject,
                },
            )),
            Some("json_schema") => {
                let inner = format.get("json_schema").ok_or_else(|| {
                    ApiError::invalid(
                        "response_format.json_schema",
                        "a json_schema response_format needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}",
                    )
                })?;
                let s = inner.get("schema").ok_or_else(|| {
                    ApiError::invalid(
                        "response_format.json_schema.schema",
                        "the schema is missing",
                    )
                })?;
                let mut grammar = schema("response_format.json_schema.schema", s)?;
                if inner.get("strict") == Some(&Value::Bool(true)) {
                    if let Grammar::JsonSchema(s) = &mut grammar {
                        close_objects(s);
                    }
                }
                found.push(("response_format".into(), grammar));
            }
            _ => {
                return Err(ApiError::invalid(
                    "response_format.type",
                    "response_format.type must be \"text\", \"json_object\" or \"json_schema\"",
                ))
            }
        }
    }
    if let Some(v) = field("structured_outputs") {
        let o = v.as_object().ok_or_else(|| {
            ApiError::invalid("structured_outputs", "structured_outputs must be an object")
        })?;
        for (key, value) in o.iter().filter(|(_, v)| !v.is_null()) {
            let name = format!("structured_outputs.{key}");
            let grammar = match key.as_str() {
                "json" => schema(&name, value)?,
                "regex" => Grammar::Regex(string(&name, value)?),
                "choice" => choice(&name, value)?,
                "grammar" => Grammar::Lark(string(&name, value)?),
                "json_object" if value == &Value::Bool(true) => Grammar::JsonObject,
                "json_object" => continue,
                "disable_any_whitespace" | "disable_fallback" | "disable_additional_properties" => {
                    continue
                }
                _ => {
                    return Err(ApiError::invalid(
                        name,
                        format!("structured_outputs.{key} is not supported (json, regex, choice, grammar, json_object are)"),
                    ))
                }
            };
            found.push(("structured_outputs".into(), grammar));
        }
        if o.get("disable_additional_properties") == Some(&Value::Bool(true)) {
            if let Some((_, Grammar::JsonSchema(s))) = found.last_mut() {
                close_objects(s);
            }
        }
    }
    enum Kind {
        Schema,
        Regex,
        Choice,
        Lark,
    }
    for (name, kind) in [
        ("guided_json", Kind::Schema),
        ("guided_regex", Kind::Regex),
        ("guided_choice", Kind::Choice),
        ("guided_grammar", Kind::Lark),
        ("grammar", Kind::Lark),
        ("json_schema", Kind::Schema),
    ] {
        if let Some(v) = field(name) {
            let grammar = match kind {
                Kind::Schema => schema(name, v)?,
                Kind::Regex => Grammar::Regex(string(name, v)?),
                Kind::Choice => choice(name, v)?,
                Kind::Lark => Grammar::Lark(string(name, v)?),
            };
            found.push((name.into(), grammar));
        }
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        return Err(ApiError::invalid(
            found[1].0.clone(),
            format!(
                "only one structured output may be asked for, not {}",
                names.join(" and ")
            ),
        ));
    }
    Ok(found.pop())
}

/// `schema` under a `strict` flag (`field` names it; absent or null: off): strict closes
/// its objects ([`close_objects`]), as OpenAI's strict mode does.
pub(crate) fn close_if_strict(
    mut schema: Value,
    strict: Option<&Value>,
    field: &str,
) -> Result<Value, ApiError> {
    match strict {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => close_objects(&mut schema),
        Some(_) => {
            return Err(ApiError::invalid(
                field,
                format!("{field} must be true or false"),
            ))
        }
    }
    Ok(schema)
}

/// OpenAI's strict mode: an object schema that does not say otherwise allows no properties
/// beyond those it lists (`additionalProperties: false`), at every depth.
fn close_objects(schema: &mut Value) {
    match schema {
        Value::Object(o) => {
            let is_object = o.get("type").and_then(Value::as_str) == Some("object")
                || o.contains_key("properties");
            if is_object && !o.contains_key("additionalProperties") {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (key, value) in o.iter_mut() {
                // Property names and enum values are data, not schemas.
                if !["enum", "const", "required", "default", "examples"].contains(&key.as_str()) {
                    close_objects(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strict_schemas_close_every_object_but_not_data() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
                "c": {"type": "array", "items": {"properties": {"d": {"type": "string"}}}},
                "e": {"type": "object", "additionalProperties": true},
                "f": {"enum": [{"type": "object"}], "default": {"properties": {}}}
            }
        });
        close_objects(&mut schema);
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["a"]["additionalProperties"], false);
        assert_eq!(
            schema["properties"]["c"]["items"]["additionalProperties"],
            false
        );
        assert_eq!(schema["properties"]["e"]["additionalProperties"], true);
        assert_eq!(
            schema["properties"]["f"]["enum"][0],
            json!({"type": "object"})
        );
        assert_eq!(
            schema["properties"]["f"]["default"],
            json!({"properties": {}})
        );
        // The properties map itself is not a schema.
        assert!(schema["properties"].get("additionalProperties").is_none());
    }

    #[test]
    fn structured_output_fields_map_to_grammars() {
        let s = |body: Value| structured_output(&body);
        assert_eq!(s(json!({})).unwrap(), None);
        assert_eq!(
            s(json!({"response_format": {"type": "text"}})).unwrap(),
            None
        );
        assert_eq!(
            s(json!({"response_format": {"type": "json_object"}})).unwrap(),
            Some(("response_format".into(), Grammar::JsonObject))
        );
        assert_eq!(
            s(json!({"guided_choice": ["a", "b"]})).unwrap(),
            Some((
                "guided_choice".into(),
                Grammar::Choice(vec!["a".into(), "b".into()])
            ))
        );
        assert_eq!(
            s(json!({"structured_outputs": {"regex": "a+"}})).unwrap(),
            Some(("structured_outputs".into(), Grammar::Regex("a+".into())))
        );
        assert_eq!(
            s(json!({"guided_json": "{\"type\": \"integer\"}"})).unwrap(),
            Some((
                "guided_json".into(),
                Grammar::JsonSchema(json!({"type": "integer"}))
            ))
        );
        let param = |body: Value| s(body).unwrap_err().param;
        assert_eq!(
            param(json!({"guided_json": "{"})).as_deref(),
            Some("guided_json")
        );
        assert_eq!(
            param(json!({"structured_outputs": {"whitespace_pattern": " "}})).as_deref(),
            Some("structured_outputs.whitespace_pattern")
        );
        assert_eq!(
            param(json!({"grammar": "x", "guided_regex": "y"})).as_deref(),
            Some("grammar")
        );
    }
}
