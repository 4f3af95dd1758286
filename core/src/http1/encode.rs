//! Percent-encoding for request targets (RFC 3986).

/// True for RFC 3986 unreserved characters (`ALPHA DIGIT - . _ ~`).
pub const fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Appends `segment` to `out` as one path segment: every byte that is not
/// unreserved is percent-encoded (so `/`, `?`, `#` and `%` never leak).
pub fn push_path_segment(out: &mut String, segment: &str) {
    for &b in segment.as_bytes() {
        push_byte(out, b, false);
    }
}

/// Appends `value` to `out` as one `application/x-www-form-urlencoded`
/// component: unreserved bytes as is, space as `+`, the rest percent-encoded.
pub fn push_query_component(out: &mut String, value: &str) {
    for &b in value.as_bytes() {
        push_byte(out, b, true);
    }
}

fn push_byte(out: &mut String, b: u8, form: bool) {
    if is_unreserved(b) {
        out.push(char::from(b));
    } else if form && b == b' ' {
        out.push('+');
    } else {
        out.push('%');
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_encodes_everything_but_unreserved() {
        let mut s = String::new();
        push_path_segment(&mut s, "a b/c?d#e%f~g.h_i-j\u{e9}");
        assert_eq!(s, "a%20b%2Fc%3Fd%23e%25f~g.h_i-j%C3%A9");
    }

    #[test]
    fn query_uses_plus_for_space() {
        let mut s = String::new();
        push_query_component(&mut s, "/bin/sh -c 'x&y=z'");
        assert_eq!(s, "%2Fbin%2Fsh+-c+%27x%26y%3Dz%27");
    }
}
