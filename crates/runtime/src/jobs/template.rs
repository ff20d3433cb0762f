//! A job's instruction template (SPEC 10): `{column}` fills in a field of the
//! item's row, `{{` and `}}` are literal braces. Checked at creation: every
//! column it names must exist in the input.

use serde_json::{Map, Value};

/// A template's pieces.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Column(String),
}

fn pieces(t: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = t.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some('{') | None => {
                            return Err(format!(
                                "instruction: a `{{` without its `}}` after {name:?} (write {{{{ for a literal brace)"
                            ));
                        }
                        Some(c) => name.push(c),
                    }
                }
                if name.trim().is_empty() {
                    return Err("instruction: `{}` names no column".into());
                }
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::Column(name.trim().to_owned()));
            }
            '}' => return Err("instruction: a lone `}` (write }} for a literal brace)".into()),
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

/// The columns the template names, in order, each once.
pub fn columns(t: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for p in pieces(t)? {
        if let Piece::Column(c) = p
            && !out.contains(&c)
        {
            out.push(c);
        }
    }
    Ok(out)
}

/// The instruction for one row. A string field is put in as it is, any
/// other value as its JSON; a missing field (checked at creation, so only
/// for a row that lacks what others have) as nothing.
pub fn render(t: &str, fields: &Map<String, Value>) -> Result<String, String> {
    let mut out = String::new();
    for p in pieces(t)? {
        match p {
            Piece::Text(s) => out.push_str(&s),
            Piece::Column(c) => match fields.get(&c) {
                Some(Value::String(s)) => out.push_str(s),
                Some(v) => out.push_str(&v.to_string()),
                None => {}
            },
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn columns_fill_in_and_double_braces_are_literal() {
        let t = "Summarise {title} ({year}) as {{\"summary\": ...}}; {title} again";
        assert_eq!(columns(t).unwrap(), ["title", "year"]);
        let row = json!({"title": "Dune", "year": 1965})
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(
            render(t, &row).unwrap(),
            "Summarise Dune (1965) as {\"summary\": ...}; Dune again"
        );
    }

    #[test]
    fn malformed_templates_are_refused() {
        assert!(columns("a {b").unwrap_err().contains("without its"));
        assert!(columns("a } b").unwrap_err().contains("lone `}`"));
        assert!(columns("a {} b").unwrap_err().contains("names no column"));
        assert!(columns("{a{b}").is_err());
    }
}
