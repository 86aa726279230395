//! Kubernetes resource quantities (`10Gi`, `20000Mi`, `8G`, `1.5Gi`, `1e9`), as
//! `pinnedDeviceMemoryLimit` is written.
//!
//! Written here rather than taken from a crate: `k8s-openapi` (a dependency, for the API
//! objects) has a `Quantity` that is only its text, without parsing, and a crate that parses
//! it (`kube_quantity`, `k8s_quantity_parser`) would be one more dependency for one small
//! grammar, with its own errors instead of [`QuantityError`]'s (the text, and what is wrong
//! with it) and without this exact arithmetic. This follows Kubernetes' `resource.Quantity`
//! grammar exactly:
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= e <signedNumber> | E <signedNumber>
//! ```
//!
//! A memory size cannot be negative, so a `-` sign is rejected. Arithmetic is exact (`u128`
//! rationals); the byte count is rounded down.

/// A text that is not a usable quantity of bytes; each variant carries the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not in Kubernetes' quantity grammar.
    #[error("`{0}` is not a Kubernetes quantity (for example 10Gi, 20000Mi, 8G or 1.5Gi)")]
    NotAQuantity(String),
    /// A `-` sign.
    #[error("`{0}` is negative; a memory limit must be positive")]
    Negative(String),
    /// More bytes than fit in 128 bits.
    #[error("`{0}` is too large")]
    TooLarge(String),
    /// An exponent too small to compute.
    #[error("`{0}` is too small")]
    TooSmall(String),
}

/// Parses a quantity of bytes. Returns the byte count, rounded down.
///
/// # Errors
/// [`QuantityError`] naming `text` and what is wrong with it.
pub fn parse_bytes(text: &str) -> Result<u128, QuantityError> {
    let p = parts(text)?;
    if p.exp >= 0 {
        p.numerator
            .checked_mul(pow10(text, p.exp)?)
            .ok_or_else(|| QuantityError::TooLarge(text.to_string()))
    } else {
        // A huge negative exponent just means "less than one byte".
        Ok(pow10(text, p.exp).map_or(0, |d| p.numerator / d))
    }
}

/// A quantity as an exact fraction: `numerator / denominator` (the denominator a power of
/// ten, 1 for a whole number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fraction {
    /// The numerator.
    pub numerator: u128,
    /// The denominator (at least 1).
    pub denominator: u128,
}

impl Fraction {
    /// The value rounded down.
    pub fn floor(self) -> u128 {
        self.numerator / self.denominator
    }

    /// The value rounded up.
    pub fn ceil(self) -> u128 {
        self.numerator.div_ceil(self.denominator)
    }

    /// Whether the value is a whole number.
    pub fn is_whole(self) -> bool {
        self.numerator.is_multiple_of(self.denominator)
    }
}

/// Parses a quantity exactly (`250m` is 250/1000, `1.5Gi` 1610612736/1; any quantity, not only
/// bytes): for checks that must not round first, such as a range's bounds.
///
/// # Errors
/// [`QuantityError`] naming `text`; [`QuantityError::TooSmall`] also for a fraction whose
/// denominator does not fit 128 bits (below 10^-38).
pub fn parse_fraction(text: &str) -> Result<Fraction, QuantityError> {
    let p = parts(text)?;
    if p.exp >= 0 {
        let numerator = p
            .numerator
            .checked_mul(pow10(text, p.exp)?)
            .ok_or_else(|| QuantityError::TooLarge(text.to_string()))?;
        return Ok(Fraction {
            numerator,
            denominator: 1,
        });
    }
    let denominator = pow10(text, p.exp).map_err(|_| QuantityError::TooSmall(text.to_string()))?;
    Ok(Fraction {
        numerator: p.numerator,
        denominator,
    })
}

/// A quantity's value as `numerator × 10^exp`.
struct Parts {
    numerator: u128,
    exp: i32,
}

/// 10^|e|, or [`QuantityError::TooLarge`] when it does not fit 128 bits.
fn pow10(text: &str, e: i32) -> Result<u128, QuantityError> {
    10u128
        .checked_pow(e.unsigned_abs())
        .ok_or_else(|| QuantityError::TooLarge(text.to_string()))
}

fn parts(text: &str) -> Result<Parts, QuantityError> {
    let bad = || QuantityError::NotAQuantity(text.to_string());
    let s = text.strip_prefix('+').unwrap_or(text);
    if s.starts_with('-') {
        return Err(QuantityError::Negative(text.to_string()));
    }
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return Err(bad());
    }
    // mantissa = int_part.frac_part as an integer, scaled by 10^-frac_len.
    let mut mantissa: u128 = 0;
    for c in int_part.chars().chain(frac_part.chars()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(c.to_digit(10).expect("digit"))))
            .ok_or_else(|| QuantityError::TooLarge(text.to_string()))?;
    }
    let frac_len = i32::try_from(frac_part.len()).map_err(|_| bad())?;
    let (binary, exp10): (u32, i32) = match suffix {
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "m" => (0, -3),
        "" => (0, 0),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        _ => match suffix.strip_prefix(['e', 'E']) {
            Some(exp) => {
                let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                    return Err(bad());
                }
                let e: i32 = exp
                    .parse()
                    .map_err(|_| QuantityError::TooLarge(text.to_string()))?;
                (0, e)
            }
            None => return Err(bad()),
        },
    };
    // Checked: `1.5e-2147483648` must be an error, not an overflow panic.
    let exp = exp10
        .checked_sub(frac_len)
        .ok_or_else(|| QuantityError::TooSmall(text.to_string()))?;
    let numerator = mantissa
        .checked_shl(binary)
        .filter(|v| v >> binary == mantissa)
        .ok_or_else(|| QuantityError::TooLarge(text.to_string()))?;
    Ok(Parts { numerator, exp })
}

/// Bytes in a MiB.
pub const MIB: u128 = 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_suffixes() {
        let gi = 1u128 << 30;
        let cases: &[(&str, u128)] = &[
            ("10Gi", 10 * gi),
            ("20000Mi", 20000 * MIB),
            ("512Ki", 512 * 1024),
            ("1Ti", 1 << 40),
            ("8G", 8_000_000_000),
            ("8M", 8_000_000),
            ("5k", 5000),
            ("1.5Gi", 3 * gi / 2),
            ("0.5Mi", MIB / 2),
            (".5Mi", MIB / 2),
            ("2.Mi", 2 * MIB),
            ("1e9", 1_000_000_000),
            ("1E3", 1000),
            ("12e+2", 1200),
            ("15e-1", 1),
            ("1500m", 1),
            ("+4Gi", 4 * gi),
            ("1073741824", gi),
            ("0", 0),
        ];
        for (text, bytes) in cases {
            assert_eq!(parse_bytes(text), Ok(*bytes), "{text}");
        }
    }

    #[test]
    fn fractions_are_exact() {
        let f = |t: &str| parse_fraction(t).unwrap();
        assert_eq!(
            f("250m"),
            Fraction {
                numerator: 250,
                denominator: 1000
            }
        );
        assert_eq!(f("1.5Gi").floor(), 3 * (1u128 << 30) / 2);
        assert!(f("1.5Gi").is_whole());
        assert!(!f("0.9").is_whole());
        assert!(f("1000m").is_whole() && f("1000m").floor() == 1);
        assert!(f("1e0").is_whole() && f("1e0").floor() == 1);
        assert_eq!((f("1e-3").floor(), f("1e-3").ceil()), (0, 1));
        assert_eq!(f("0").ceil(), 0);
        assert!(matches!(
            parse_fraction("1e-39"),
            Err(QuantityError::TooSmall(_))
        ));
        assert!(parse_fraction("lots").is_err());
    }

    #[test]
    fn extreme_exponents_are_errors_or_zero_never_panics() {
        // Regression: `exp10 - frac_len` overflowed (a panic in debug builds).
        assert!(parse_bytes("1.5e-2147483648").is_err());
        assert_eq!(parse_bytes("1e-2147483648"), Ok(0));
        assert!(parse_bytes("1e2147483647").is_err());
    }

    #[test]
    fn not_quantities() {
        for bad in [
            "",
            "Gi",
            "10GB",
            "10gi",
            "10 Gi",
            "1.2.3Gi",
            "-1Gi",
            "ten",
            "1e",
            "1e+",
            "1ee3",
            "0x10",
            "10Gi ",
            "1e99999999999",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
        assert!(parse_bytes("-1Gi")
            .unwrap_err()
            .to_string()
            .contains("negative"));
        assert!(parse_bytes("99999999999999999999999999999999999999999Ei")
            .unwrap_err()
            .to_string()
            .contains("too large"));
    }
}
