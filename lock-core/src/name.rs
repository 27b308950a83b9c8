//! Validated lock names.

use std::fmt;
use std::sync::Arc;

use crate::error::LockError;

/// A validated lock name.
///
/// Rules, checked once here so that every backend can rely on them:
/// - not empty;
/// - no NUL character (C-string based drivers and ZooKeeper paths choke on it);
/// - at most [`LockName::MAX_LEN`] bytes of UTF-8;
/// - case-sensitive: `"Job"` and `"job"` are two locks.
///
/// Any other Unicode is allowed. Each backend maps the name to its own key,
/// path or row safely (escaping or hashing where the service has limits).
///
/// ```
/// use lock_core::LockName;
/// let name = LockName::new("reports/nightly").unwrap();
/// assert_eq!(name.as_str(), "reports/nightly");
/// assert!(LockName::new("").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// The longest accepted name, in bytes of UTF-8.
    pub const MAX_LEN: usize = 512;

    /// Validates `name`.
    pub fn new(name: impl AsRef<str>) -> Result<Self, LockError> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(invalid("name is empty"));
        }
        if name.len() > Self::MAX_LEN {
            return Err(invalid(format!(
                "name is {} bytes long; the maximum is {}",
                name.len(),
                Self::MAX_LEN
            )));
        }
        if name.contains('\0') {
            return Err(invalid("name contains a NUL character"));
        }
        Ok(LockName(Arc::from(name)))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn invalid(reason: impl Into<String>) -> LockError {
    LockError::InvalidName {
        reason: reason.into(),
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockName {
    type Error = LockError;
    fn try_from(s: &str) -> Result<Self, LockError> {
        LockName::new(s)
    }
}

impl TryFrom<String> for LockName {
    type Error = LockError;
    fn try_from(s: String) -> Result<Self, LockError> {
        LockName::new(s)
    }
}

impl TryFrom<&String> for LockName {
    type Error = LockError;
    fn try_from(s: &String) -> Result<Self, LockError> {
        LockName::new(s)
    }
}

impl TryFrom<&LockName> for LockName {
    type Error = LockError;
    fn try_from(s: &LockName) -> Result<Self, LockError> {
        Ok(s.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_refuses() {
        assert!(LockName::new("a").is_ok());
        assert!(LockName::new("ünïcødé/🔒").is_ok());
        assert!(LockName::new("x".repeat(LockName::MAX_LEN)).is_ok());
        for bad in ["", "a\0b"] {
            assert!(matches!(
                LockName::new(bad),
                Err(LockError::InvalidName { .. })
            ));
        }
        let long = "é".repeat(LockName::MAX_LEN / 2 + 1);
        assert!(matches!(
            LockName::new(long),
            Err(LockError::InvalidName { .. })
        ));
    }

    #[test]
    fn case_sensitive() {
        assert_ne!(LockName::new("Job").unwrap(), LockName::new("job").unwrap());
    }
}
