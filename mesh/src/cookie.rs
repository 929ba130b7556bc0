//! The run cookie: a secret every process of one run shares, and nobody else.
//!
//! `launcher up` generates it once per run ([`Cookie::generate`]) and writes it
//! to a file only its owner can read ([`Cookie::write_private`], mode 0600).
//! Processes get it from that file ([`COOKIE_FILE_ENV`]) or from the
//! environment ([`COOKIE_ENV`]), never from a command line, where `ps` shows
//! it to every user of the host. It keys the data plane's frame MAC and the
//! control plane's authentication.
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Environment variable holding the cookie itself (hex).
pub const COOKIE_ENV: &str = "RLMESH_COOKIE";
/// Environment variable naming a 0600 file that holds the cookie.
pub const COOKIE_FILE_ENV: &str = "RLMESH_COOKIE_FILE";

/// Why a cookie could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CookieError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file can be read by its group or others.
    #[error("{path}: the cookie file is readable by others (mode {mode:o}); it must be 0600")]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// Not 64 hex digits.
    #[error("{origin}: a run cookie is 64 hex digits")]
    Malformed {
        /// Where it came from.
        origin: String,
    },
    /// Neither variable is set.
    #[error("no run cookie: set {COOKIE_FILE_ENV} (a 0600 file) or {COOKIE_ENV}")]
    Missing,
}

/// 32 secret bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Cookie([u8; 32]);

impl std::fmt::Debug for Cookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cookie(…)")
    }
}

impl Cookie {
    /// A fresh cookie from the kernel's random source.
    pub fn generate() -> Result<Cookie, CookieError> {
        let path = Path::new("/dev/urandom");
        let mut b = [0u8; 32];
        std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut b)).map_err(|source| CookieError::Io { path: path.into(), source })?;
        Ok(Cookie(b))
    }

    /// The secret bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits (surrounding whitespace allowed).
    pub fn from_hex(text: &str, origin: &str) -> Result<Cookie, CookieError> {
        let t = text.trim();
        let bad = || CookieError::Malformed { origin: origin.to_string() };
        if t.len() != 64 || !t.is_ascii() {
            return Err(bad());
        }
        let mut b = [0u8; 32];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Cookie(b))
    }

    /// Writes the cookie to a new file of mode 0600 (refusing to follow or overwrite).
    pub fn write_private(&self, path: &Path) -> Result<(), CookieError> {
        let io = |source| CookieError::Io { path: path.to_path_buf(), source };
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(io)?;
        f.write_all(self.to_hex().as_bytes()).and_then(|_| f.sync_all()).map_err(io)
    }

    /// Reads a cookie file, refusing one that its group or others can read.
    pub fn read_private(path: &Path) -> Result<Cookie, CookieError> {
        let io = |source| CookieError::Io { path: path.to_path_buf(), source };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(CookieError::Exposed { path: path.to_path_buf(), mode });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Cookie::from_hex(&text, &path.display().to_string())
    }

    /// The cookie of this process: [`COOKIE_FILE_ENV`] first, then [`COOKIE_ENV`].
    pub fn from_env() -> Result<Cookie, CookieError> {
        if let Some(p) = std::env::var_os(COOKIE_FILE_ENV) {
            return Cookie::read_private(Path::new(&p));
        }
        match std::env::var(COOKIE_ENV) {
            Ok(v) => Cookie::from_hex(&v, COOKIE_ENV),
            Err(_) => Err(CookieError::Missing),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_file_is_private_and_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("cookie");
        let c = Cookie::generate().unwrap();
        assert_ne!(c, Cookie::generate().unwrap());
        c.write_private(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(Cookie::read_private(&p).unwrap(), c);
        // Never overwritten.
        assert!(matches!(Cookie::generate().unwrap().write_private(&p), Err(CookieError::Io { .. })));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(Cookie::read_private(&p), Err(CookieError::Exposed { mode: 0o644, .. })));
        assert!(format!("{c:?}") == "Cookie(…)", "the secret never reaches a log");
    }

    #[test]
    fn malformed_cookies_are_refused() {
        for t in ["", "abc", &"g".repeat(64), &"é".repeat(32)] {
            assert!(matches!(Cookie::from_hex(t, "test"), Err(CookieError::Malformed { .. })), "{t:?}");
        }
        let c = Cookie::generate().unwrap();
        assert_eq!(Cookie::from_hex(&format!(" {}\n", c.to_hex()), "t").unwrap(), c);
    }
}
