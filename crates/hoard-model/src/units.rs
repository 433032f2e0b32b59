//! Sizes as operators write them (`10GiB`, `5%`): parsed once here, so `config` (which reads
//! the flags) and `cache` (which applies the limits) share one meaning without importing each
//! other. Durations are humantime's (`30s`, `7d`) and need nothing of ours.

/// Parses `1234`, `64KiB`, `10MiB`, `10GiB`, `1TiB` (also KB/MB/GB/TB, read as powers of 1024).
/// A size that does not fit in 64 bits is refused, never wrapped.
pub fn parse_size(raw: &str) -> Result<u64, String> {
    let raw = raw.trim();
    let digits = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
    let (number, unit) = raw.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{raw:?} is not a size such as 10GiB"))?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("{raw:?} has an unknown unit (use KiB, MiB or GiB)")),
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("{raw:?} is too large"))
}

/// Free space to keep: bytes, or a share of the file system (from 0% to below 100%).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FreeSpace {
    Bytes(u64),
    Percent(f64),
}

impl FreeSpace {
    /// Parses `5%`, `2GiB`, `1000000`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        if let Some(percent) = raw.strip_suffix('%') {
            let value: f64 = percent
                .trim()
                .parse()
                .map_err(|_| format!("{raw:?} is not a percentage such as 5%"))?;
            if !(0.0..100.0).contains(&value) {
                return Err(format!("{raw:?} must be from 0% to below 100%"));
            }
            return Ok(Self::Percent(value));
        }
        parse_size(raw).map(Self::Bytes)
    }

    /// The bytes to keep free on a file system of `total` bytes.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            Self::Bytes(n) => n,
            Self::Percent(p) => (total as f64 * p / 100.0) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("1234"), Ok(1234));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("3 MB"), Ok(3 << 20));
        assert_eq!(parse_size(" 2tib "), Ok(2 << 40));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(
            parse_size("16777216TiB").is_err(),
            "2^64 bytes does not fit"
        );
    }

    #[test]
    fn free_space_is_bytes_or_a_share() {
        assert_eq!(FreeSpace::parse("5%"), Ok(FreeSpace::Percent(5.0)));
        assert_eq!(FreeSpace::parse("2GiB"), Ok(FreeSpace::Bytes(2 << 30)));
        assert_eq!(FreeSpace::Percent(10.0).bytes(1000), 100);
        assert!(FreeSpace::parse("100%").is_err());
        assert!(FreeSpace::parse("-1%").is_err());
        assert!(FreeSpace::parse("NaN%").is_err());
        assert!(FreeSpace::parse("lots").is_err());
    }
}
