//! Instants as people and other programs read them: milliseconds since the
//! Unix epoch turned into a civil date and into RFC 3339, by hand, so that
//! no date crate enters the tree for two functions. The calendar is the
//! proleptic Gregorian one (Howard Hinnant's `civil_from_days`). Pure: the
//! instant comes in as an argument.

/// A civil date (year, month 1..=12, day 1..=31) from days since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC,
/// `YYYY-MM-DDTHH:MM:SS.mmmZ`. Years outside 0000..=9999 cannot be written
/// in RFC 3339 and are clamped to its ends.
pub fn rfc3339_utc_ms(ms: i64) -> String {
    // 0000-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z.
    const MIN_MS: i64 = -62_167_219_200_000;
    const MAX_MS: i64 = 253_402_300_799_999;
    let ms = ms.clamp(MIN_MS, MAX_MS);
    let in_day = ms.rem_euclid(86_400_000);
    let (h, m, s, milli) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    let (year, month, day) = civil_from_days(ms.div_euclid(86_400_000));
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests {
    use super::{civil_from_days, rfc3339_utc_ms};

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339_utc_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_utc_ms(1_700_000_000_123),
            "2023-11-14T22:13:20.123Z"
        );
        // A leap day, and the last millisecond of a leap year.
        assert_eq!(rfc3339_utc_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_utc_ms(978_307_199_999), "2000-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_utc_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_utc_ms(i64::MIN), "0000-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_utc_ms(i64::MAX), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn days_become_civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
