//! One round of `throttle-workload spiky`, as the workload prints it and as its readers (the
//! advise and burst tests) parse it: `round I start_ns A end_ns B cpu_ns C wall_ms W`, then
//! ` group_ns G` with `--usage-file` and ` throttled T` with `--stat-file`.
use core::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Round {
    pub index: u32,
    /// CLOCK_MONOTONIC at the round's start and end.
    pub start_ns: u64,
    pub end_ns: u64,
    /// The process's CPU over the round (CLOCK_PROCESS_CPUTIME_ID).
    pub cpu_ns: u64,
    /// The cgroup's usage counter's growth from just before the round to just before the next
    /// (with `--usage-file`).
    pub group_ns: Option<u64>,
    /// The periods the kernel counted throttled (cpu.stat `nr_throttled`) over the same span
    /// (with `--stat-file`): whether the kernel stopped the round.
    pub throttled: Option<u64>,
}

impl Round {
    /// The round a line holds; `None` for any other line.
    pub fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        let index = field(&mut words, "round")?.parse().ok()?;
        let start_ns = field(&mut words, "start_ns")?.parse().ok()?;
        let end_ns = field(&mut words, "end_ns")?.parse().ok()?;
        let cpu_ns = field(&mut words, "cpu_ns")?.parse().ok()?;
        field(&mut words, "wall_ms")?.parse::<f64>().ok()?;
        let (mut group_ns, mut throttled) = (None, None);
        while let Some(key) = words.next() {
            let value = Some(words.next()?.parse().ok()?);
            match key {
                "group_ns" if group_ns.is_none() && throttled.is_none() => group_ns = value,
                "throttled" if throttled.is_none() => throttled = value,
                _ => return None,
            }
        }
        Some(Self {
            index,
            start_ns,
            end_ns,
            cpu_ns,
            group_ns,
            throttled,
        })
    }
}

/// The value after `key`, if `key` is the next word.
fn field<'a>(words: &mut impl Iterator<Item = &'a str>, key: &str) -> Option<&'a str> {
    (words.next()? == key).then(|| words.next())?
}

impl fmt::Display for Round {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "round {} start_ns {} end_ns {} cpu_ns {} wall_ms {:.1}",
            self.index,
            self.start_ns,
            self.end_ns,
            self.cpu_ns,
            self.end_ns.saturating_sub(self.start_ns) as f64 / 1e6
        )?;
        if let Some(g) = self.group_ns {
            write!(f, " group_ns {g}")?;
        }
        match self.throttled {
            Some(t) => write!(f, " throttled {t}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    #[test]
    fn a_printed_round_parses_back() {
        let r = Round {
            index: 2,
            start_ns: 10_000_000,
            end_ns: 90_000_000,
            cpu_ns: 80_000_000,
            group_ns: Some(81_000_000),
            throttled: Some(1),
        };
        let line = r.to_string();
        assert_eq!(
            line,
            "round 2 start_ns 10000000 end_ns 90000000 cpu_ns 80000000 wall_ms 80.0 group_ns \
             81000000 throttled 1"
        );
        assert_eq!(Round::parse(&line), Some(r));
        let without = Round {
            group_ns: None,
            throttled: None,
            ..r
        };
        assert_eq!(
            Round::parse("round 2 start_ns 10000000 end_ns 90000000 cpu_ns 80000000 wall_ms 80.0"),
            Some(without)
        );
        for other in [
            "synced refill_ns 5",
            "round 2 start_ns 1 end_ns 2",
            "round 2 start_ns 1 end_ns 2 cpu_ns 3 wall_ms 0.0 group_ns 4 more",
            "round 2 start_ns 1 end_ns 2 cpu_ns 3 wall_ms 0.0 throttled 1 group_ns 4",
            "round x start_ns 1 end_ns 2 cpu_ns 3 wall_ms 0.0",
        ] {
            assert_eq!(Round::parse(other), None, "{other}");
        }
    }
}
