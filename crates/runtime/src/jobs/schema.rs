//! A job's `output_schema`, compiled and applied with boon, resolving
//! nothing outside the document (issue 24).
//!
//! boon's default loader opens `file://` URLs named by `$ref`, `$schema` or
//! an `$id` a reference resolves against: a caller could make the
//! supervisor open a FIFO (and hang the request that compiles it), or learn
//! whether a file exists from the error. Here the one loader refuses every
//! URL without looking at it, whatever its scheme, so the error is the same
//! for a file that exists, one that does not and a URL on the network.
//! boon's own copies of the JSON Schema metaschemas (drafts 4 to 2020-12)
//! are read before any loader is asked, so `$schema` naming a draft keeps
//! working; a definition the schema uses must be in it (`$defs`).

use serde_json::Value;

/// The name the schema is known by while it is compiled.
const LOCATION: &str = "brood:output_schema";

/// The loader of every URL scheme: refuses without looking.
struct Nothing;

impl boon::UrlLoader for Nothing {
    fn load(&self, url: &str) -> Result<Value, Box<dyn std::error::Error>> {
        Err(format!("{url}: brood resolves nothing outside the schema").into())
    }
}

/// A compiler that reads only what it is given.
fn compiler() -> boon::Compiler {
    let mut c = boon::Compiler::new();
    c.use_loader(Box::new(Nothing));
    c
}

/// A compile error as the caller is told it: a reference outside the
/// document named as such, anything else in boon's words.
fn describe(e: &boon::CompileError) -> String {
    match e {
        boon::CompileError::LoadUrlError { url, .. }
        | boon::CompileError::UnsupportedUrlScheme { url } => format!(
            "{url:?} is outside the schema ($ref, $schema or $id): brood resolves nothing \
             outside the document; put the definition under $defs"
        ),
        other => other.to_string(),
    }
}

fn compiled(schema: &Value) -> Result<(boon::Schemas, boon::SchemaIndex), String> {
    let mut schemas = boon::Schemas::new();
    let mut c = compiler();
    c.add_resource(LOCATION, schema.clone())
        .map_err(|e| describe(&e))?;
    let id = c
        .compile(LOCATION, &mut schemas)
        .map_err(|e| describe(&e))?;
    Ok((schemas, id))
}

/// A JSON Schema, compiled (draft 2020-12 unless it says otherwise).
pub fn compile(schema: &Value) -> Result<(), String> {
    compiled(schema).map(drop)
}

/// Whether `value` satisfies `schema`; the first violations when not.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    let (schemas, id) = compiled(schema)?;
    schemas.validate(value, id).map_err(|e| {
        let text = e.to_string();
        text.chars().take(500).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drafts_compile_and_nothing_outside_is_opened() {
        for draft in [
            "https://json-schema.org/draft/2020-12/schema",
            "http://json-schema.org/draft-07/schema#",
        ] {
            compile(&json!({"$schema": draft, "type": "object"})).unwrap();
        }
        let inside =
            json!({"$defs": {"a": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/a"}}});
        compile(&inside).unwrap();
        assert!(validate(&inside, &json!({"x": 1})).is_err());
        validate(&inside, &json!({"x": "y"})).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let there = dir.path().join("there.json");
        std::fs::write(&there, r#"{"type": "string"}"#).unwrap();
        let url = |p: &std::path::Path| format!("file://{}", p.display());
        let e_there = compile(&json!({"$ref": url(&there)})).unwrap_err();
        assert!(e_there.contains("outside the schema"), "{e_there}");
        let gone = dir.path().join("gone.json");
        let e_gone = compile(&json!({"$ref": url(&gone)})).unwrap_err();
        // No oracle: the two differ only by the name the caller gave.
        assert_eq!(
            e_there.replace(&url(&there), "URL"),
            e_gone.replace(&url(&gone), "URL")
        );
        for outside in [
            json!({"$ref": "https://example.com/s.json"}),
            json!({"$schema": url(&there)}),
            json!({"$id": format!("file://{}/", dir.path().display()), "$ref": "there.json"}),
        ] {
            let e = compile(&outside).unwrap_err();
            assert!(e.contains("outside the schema"), "{outside}: {e}");
        }
    }
}
