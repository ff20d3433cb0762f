//! Whole numbers as a JSON Schema `integer` is (2020-12, which OpenAPI 3.1
//! uses): `3` and `3.0` alike, since a number whose fraction is zero is an
//! integer there. serde reads `3.0` as a float only, and a client that
//! writes every number as a float (JavaScript's, often) would be refused a
//! request the document calls valid. For `#[serde(deserialize_with)]`.

use serde::de::{Deserialize, Deserializer, Error};
use serde_json::Number;

/// `n` as a whole number within `max`, or why not.
fn whole(n: &Number, max: u64) -> Result<u64, String> {
    let v = match n.as_u64() {
        Some(v) => Some(v),
        // 2^64 as an f64 is exact; below it, a float with no fraction is a
        // whole number that fits.
        None => n
            .as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 18_446_744_073_709_551_616.0)
            .map(|f| f as u64),
    };
    match v {
        Some(v) if v <= max => Ok(v),
        _ => Err(format!("{n}: must be a whole number from 0 to {max}")),
    }
}

pub fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole(&Number::deserialize(d)?, u64::MAX).map_err(D::Error::custom)
}

pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<Number>::deserialize(d)?
        .map(|n| whole(&n, u64::MAX).map_err(D::Error::custom))
        .transpose()
}

pub fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Option::<Number>::deserialize(d)?
        .map(|n| {
            whole(&n, u64::from(u32::MAX))
                .map(|v| v as u32)
                .map_err(D::Error::custom)
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct T {
        #[serde(default, deserialize_with = "super::opt_u32")]
        n: Option<u32>,
    }

    fn n(text: &str) -> Result<Option<u32>, String> {
        serde_json::from_str::<T>(text)
            .map(|t| t.n)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_whole_float_is_a_whole_number() {
        assert_eq!(n(r#"{"n": 3}"#), Ok(Some(3)));
        assert_eq!(n(r#"{"n": 3.0}"#), Ok(Some(3)));
        assert_eq!(n(r#"{"n": null}"#), Ok(None));
        assert_eq!(n(r#"{}"#), Ok(None));
        for bad in ["3.5", "-1", "4294967296", "1e300", "\"3\""] {
            assert!(n(&format!(r#"{{"n": {bad}}}"#)).is_err(), "{bad}");
        }
    }
}
