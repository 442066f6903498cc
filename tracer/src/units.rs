//! Durations written for people, in the forms the outputs use: the report's spaced one
//! (`78.1 ms`), the live table's compact one (`78.1ms`), fixed milliseconds, and spans of
//! seconds to days (`12.5m`, `3.2h`).

/// `ns` in the unit that suits it, spaced (the report): ns below 1 µs, then µs, ms and s with a
/// few significant digits.
pub fn spaced(ns: u64) -> String {
    in_unit(ns, " ", 1, 3)
}

/// [`spaced`] for the live view's narrow columns: no space, a digit fewer for µs and s.
pub fn compact(ns: u64) -> String {
    in_unit(ns, "", 0, 2)
}

fn in_unit(ns: u64, space: &str, us_digits: usize, s_digits: usize) -> String {
    let f = ns as f64;
    match ns {
        0..1_000 => format!("{ns}{space}ns"),
        1_000..1_000_000 => format!("{:.*}{space}µs", us_digits, f / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}{space}ms", f / 1e6),
        _ => format!("{:.*}{space}s", s_digits, f / 1e9),
    }
}

/// `ns` in milliseconds to a tenth: `12.5 ms`.
pub fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

/// `ns` in milliseconds as exactly as it is, compact: `100ms`, `12.5ms` (settings, whole µs).
pub fn exact_ms(ns: u64) -> String {
    format!("{}ms", ns as f64 / 1e6)
}

/// Seconds as the largest unit that keeps it readable: `40s`, `12.5m`, `3.2h`, `6.9d`.
pub fn span(seconds: f64) -> String {
    let (value, unit) = match seconds {
        s if s < 60.0 => (s, "s"),
        s if s < 3600.0 => (s / 60.0, "m"),
        s if s < 86400.0 => (s / 3600.0, "h"),
        s => (s / 86400.0, "d"),
    };
    let rounded = (value * 10.0).round() / 10.0;
    format!("{rounded}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_take_the_unit_that_reads() {
        assert_eq!(span(40.0), "40s");
        assert_eq!(span(750.0), "12.5m");
        assert_eq!(span(3.2 * 3600.0), "3.2h");
        assert_eq!(span(6.9 * 86400.0), "6.9d");
        assert_eq!(span(0.07), "0.1s");
    }

    #[test]
    fn each_form_picks_its_unit_and_digits() {
        assert_eq!(spaced(999), "999 ns");
        assert_eq!(spaced(1_500), "1.5 µs");
        assert_eq!(spaced(78_123_456), "78.1 ms");
        assert_eq!(spaced(4_475_123_000), "4.475 s");
        assert_eq!(compact(999), "999ns");
        assert_eq!(compact(1_500), "2µs");
        assert_eq!(compact(78_123_456), "78.1ms");
        assert_eq!(compact(4_475_123_000), "4.48s");
        assert_eq!(ms(12_345_678), "12.3 ms");
        assert_eq!(exact_ms(12_500_000), "12.5ms");
        assert_eq!(exact_ms(100_000_000), "100ms");
    }
}
