//! Numbers written in decimal without the formatter's machinery: holder
//! ids and header values are written on every request that makes them.

/// Appends `n` in decimal to `out`, as `write!(out, "{n}")` would.
pub(crate) fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_as_the_formatter_writes_them() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            1023,
            1024,
            86_400,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = String::from("x");
            push_u64(&mut out, n);
            assert_eq!(out, format!("x{n}"));
        }
    }
}
