//! Sizes as people write them: `4GiB`, `512MiB`, `1.5GB`, `1024`, and budgets as
//! `P%` of a reference peak.

use std::fmt;

/// A memory budget as written on the command line, before it is resolved against a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetSpec {
    /// An absolute size in bytes (or plain units for hand-written chains).
    Bytes(u64),
    /// A percentage of a reference peak (the store-all peak, or the activation peak).
    Percent(f64),
}

impl BudgetSpec {
    /// Resolves the budget against the reference it is a percentage of.
    /// The result is rounded down, so `100%` is exactly the reference.
    pub fn resolve(self, reference: u64) -> u64 {
        match self {
            BudgetSpec::Bytes(b) => b,
            BudgetSpec::Percent(p) => ((reference as f64) * p / 100.0).floor() as u64,
        }
    }
}

impl fmt::Display for BudgetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetSpec::Bytes(b) => write!(f, "{}", format_bytes(*b)),
            BudgetSpec::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// Parses a budget: a size (see [`parse_size`]) or a percentage such as `50%`.
pub fn parse_budget(text: &str) -> Result<BudgetSpec, String> {
    let t = text.trim();
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p.trim().parse().map_err(|_| format!("`{text}` is not a percentage (expected e.g. `50%`)"))?;
        if !v.is_finite() || v <= 0.0 {
            return Err(format!("`{text}`: a percentage budget must be positive"));
        }
        return Ok(BudgetSpec::Percent(v));
    }
    parse_size(t).map(BudgetSpec::Bytes)
}

/// Parses a size: plain bytes (`1024`), or a number with a unit. Binary units
/// (`KiB`, `MiB`, `GiB`, `TiB`) are powers of 1024; decimal units (`kB`, `MB`,
/// `GB`, `TB`) powers of 1000; `B` is bytes. Case-insensitive, spaces allowed.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty size".into());
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E'))
        .unwrap_or(t.len());
    // `e` may be the start of `EiB`; only treat it as an exponent when followed by a digit.
    let (num, unit) = t.split_at(split);
    let (num, unit) = match num.rfind(['e', 'E']) {
        Some(i) if !num[i + 1..].starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+') => {
            (&t[..i], &t[i..])
        }
        _ => (num, unit),
    };
    let value: f64 =
        num.trim().parse().map_err(|_| format!("`{text}` is not a size (expected e.g. `4GiB`, `512MiB` or `1024`)"))?;
    if value < 0.0 {
        return Err(format!("`{text}`: a size must be non-negative"));
    }
    if !value.is_finite() {
        return Err(format!("`{text}` is too large"));
    }
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "ki" | "kib" => 1024.0,
        "mi" | "mib" => 1024f64.powi(2),
        "gi" | "gib" => 1024f64.powi(3),
        "ti" | "tib" => 1024f64.powi(4),
        other => {
            return Err(format!("`{text}`: unknown size unit `{other}` (use B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"))
        }
    };
    let bytes = value * mult;
    if bytes > u64::MAX as f64 {
        return Err(format!("`{text}` is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes with a binary unit and three significant decimals: `1.500 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.3} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512 mib"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("2e3"), Ok(2000));
        assert_eq!(
            parse_size("1EiB").unwrap_err(),
            "`1EiB`: unknown size unit `eib` (use B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"
        );
        assert_eq!(parse_size("-4GiB").unwrap_err(), "`-4GiB`: a size must be non-negative");
        assert_eq!(parse_size("1e400GB").unwrap_err(), "`1e400GB` is too large");
        assert_eq!(parse_size("20000000TB").unwrap_err(), "`20000000TB` is too large");
        assert!(parse_size("four").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn budgets() {
        assert_eq!(parse_budget("50%"), Ok(BudgetSpec::Percent(50.0)));
        assert_eq!(BudgetSpec::Percent(50.0).resolve(1001), 500);
        assert_eq!(parse_budget("1KiB"), Ok(BudgetSpec::Bytes(1024)));
        assert!(parse_budget("-5%").is_err());
        assert!(parse_budget("x%").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(3 << 29), "1.500 GiB");
    }
}
