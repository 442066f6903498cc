//! bcc-style log2 histogram rows, as `runqlat -m` prints them.
//!
//! Slot `i` holds values in [2^i, 2^(i+1)) of the unit, and slot 0 also holds 0 (the
//! libbpf-tools convention), so the rows read `0 -> 1`, `2 -> 3`, `4 -> 7`, ... Rows run from slot
//! 0 to the last non-empty one, so the shape starts at zero like bcc's.

/// Width of the bar column, as in bcc.
const BAR: u64 = 40;

/// The header and one row per slot, without trailing newlines; nothing when every count is 0.
pub fn log2_rows(counts: &[u32], unit: &str) -> Vec<String> {
    let Some(last) = counts.iter().rposition(|&n| n > 0) else {
        return Vec::new();
    };
    let max = counts.iter().copied().max().map_or(1, u64::from);
    let mut rows = vec![format!("     {unit:<19} : count     distribution")];
    for (i, &n) in counts[..=last].iter().enumerate() {
        let low = if i == 0 { 0 } else { 1u128 << i };
        let high = (1u128 << (i + 1)) - 1;
        // bcc's bar length: floor(40 × count / max), so only the largest row is full.
        let stars = usize::try_from(BAR * u64::from(n) / max).unwrap_or(0);
        rows.push(format!(
            "{low:>10} -> {high:<10} : {n:<8} |{:<width$}|",
            "*".repeat(stars),
            width = BAR as usize
        ));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_match_bcc_layout() {
        let rows = log2_rows(&[1, 0, 0, 0, 0, 0, 21, 4], "ms");
        let expected = [
            "     ms                  : count     distribution",
            "         0 -> 1          : 1        |*                                       |",
            "         2 -> 3          : 0        |                                        |",
            "         4 -> 7          : 0        |                                        |",
            "         8 -> 15         : 0        |                                        |",
            "        16 -> 31         : 0        |                                        |",
            "        32 -> 63         : 0        |                                        |",
            "        64 -> 127        : 21       |****************************************|",
            "       128 -> 255        : 4        |*******                                 |",
        ];
        assert_eq!(rows, expected);
    }

    #[test]
    fn trailing_empty_slots_and_empty_histograms_print_nothing() {
        assert!(log2_rows(&[], "ms").is_empty());
        assert!(log2_rows(&[0, 0], "ms").is_empty());
        assert_eq!(log2_rows(&[0, 3, 0, 0], "ms").len(), 3);
    }

    #[test]
    fn wide_values_do_not_overflow() {
        let mut counts = vec![0; 64];
        counts[63] = 1;
        let rows = log2_rows(&counts, "ms");
        assert!(rows[64].contains("9223372036854775808 -> 18446744073709551615"));
    }
}
