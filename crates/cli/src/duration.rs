//! Spans of time on the command line: every flag that takes one takes a
//! number of seconds (`30`, `1.5`) or a number with a unit (`500ms`, `30s`,
//! `5m`, `2h`), so `--timeout 5m` means what a person means by it.

/// Seconds from `30`, `1.5`, `500ms`, `30s`, `5m`, `2h` or `1d`: a clap value
/// parser, whose error clap prints after naming the flag and the value.
pub(crate) fn seconds(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let not_a_span = || {
        "not a span of time: give seconds (30, 1.5) or a number with ms, s, m, h or d (500ms, 30s, 5m, 2h)"
            .to_owned()
    };
    if number.is_empty() {
        return Err(not_a_span());
    }
    let scale = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 0.001,
        "m" | "min" | "mins" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        other => {
            return Err(format!(
                "unknown unit {other:?}: give seconds (30, 1.5) or a number with ms, s, m, h or d (500ms, 30s, 5m, 2h)"
            ));
        }
    };
    let n: f64 = number.parse().map_err(|_| not_a_span())?;
    let s = n * scale;
    if !s.is_finite() {
        return Err("too long a span of time".to_owned());
    }
    Ok(s)
}

/// Whole seconds, for the flags the API takes as whole seconds
/// (`--item-timeout`, `--max-runtime`): `90`, `90s`, `30m`, `2h`.
pub(crate) fn whole_seconds(text: &str) -> Result<u64, String> {
    let s = seconds(text)?;
    if s.fract() != 0.0 || s > u64::MAX as f64 {
        return Err(format!(
            "{s} s is not a whole number of seconds (give 90, 90s, 30m or 2h)"
        ));
    }
    Ok(s as u64)
}

#[cfg(test)]
mod tests {
    use super::{seconds, whole_seconds};

    #[test]
    fn numbers_and_units_read_as_seconds() {
        for (text, want) in [
            ("30", 30.0),
            ("1.5", 1.5),
            ("500ms", 0.5),
            ("30s", 30.0),
            ("5m", 300.0),
            ("2h", 7200.0),
            ("1d", 86_400.0),
            (" 5 m", 300.0),
        ] {
            assert_eq!(seconds(text), Ok(want), "{text}");
        }
        assert!(
            seconds("5 weeks")
                .unwrap_err()
                .contains("unknown unit \"weeks\"")
        );
        assert!(seconds("").unwrap_err().contains("not a span of time"));
        assert!(seconds("-3").unwrap_err().contains("not a span of time"));
        assert_eq!(whole_seconds("30m"), Ok(1800));
        assert!(
            whole_seconds("1.5")
                .unwrap_err()
                .contains("not a whole number of seconds")
        );
    }
}
