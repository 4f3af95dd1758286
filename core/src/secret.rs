//! A secret string (bearer tokens, registry tokens): never printed.

use core::fmt;

/// A secret value. `Debug` and `Display` print `<redacted>`; read it with
/// [`Secret::expose`] only where it goes onto the wire.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Box<str>);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<Box<str>>) -> Self {
        Self(value.into())
    }

    /// The secret text, for writing onto the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_never_printed() {
        let s = Secret::new("SENTINEL-TOKEN-42");
        assert!(!format!("{s:?} {s}").contains("SENTINEL"));
        assert_eq!(s.expose(), "SENTINEL-TOKEN-42");
    }
}
