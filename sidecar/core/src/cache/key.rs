//! The buffer's key of a URL, and the key's digest: what every stored object is found by,
//! in the index (`sidecar.buffer.store`) and in the core's table of answers alike.
//!
//! The rule is `sidecar.cache.policy.cache_key`'s (its docstring has the table): the
//! scheme and host lower-cased, the host's trailing dot and the scheme's default port
//! dropped, the path kept byte for byte (`/` when empty), the query kept in order minus
//! its empty items and, on a host of a signing family, that family's signing
//! parameters. Python calls it here for every key it makes, and the streams call it for
//! every request the table may answer: one implementation for both. What the families
//! are (their parameter names) and which family a host belongs to (the host globs,
//! matched as `--intercept`'s are) stay Python's, installed when the rules are made.
//!
//! The URLs nearly every client sends (a lower-case scheme, a host name, maybe a port,
//! then a path and query of printable ASCII, no fragment) are read here; any other
//! (`None`) takes `urllib.parse.urlsplit`'s way in Python, and its parts come back to
//! `key_of_parts`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use blake2::Blake2bVar;
use blake2::digest::{Update, VariableOutput};
use pyo3::prelude::*;

/// Bytes of a key's digest: 128 bits, so that a collision among a million keys is about
/// as likely as 10^-26.
pub const DIGEST: usize = 16;
/// Hosts whose family is remembered, at most: past it, the memory starts over.
const HOSTS: usize = 4096;

/// A key's digest: BLAKE2b of its UTF-8 bytes, 16 bytes long.
pub fn digest(key: &[u8]) -> [u8; DIGEST] {
    let mut hasher = Blake2bVar::new(DIGEST).expect("a valid BLAKE2b length");
    hasher.update(key);
    let mut digest = [0; DIGEST];
    hasher
        .finalize_variable(&mut digest)
        .expect("the length asked for");
    digest
}

/// The query parameters one family of hosts adds when it signs a URL.
struct Signing {
    names: Vec<String>,    // lower-case
    prefixes: Vec<String>, // lower-case
}

impl Signing {
    fn signs(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name) || self.prefixes.iter().any(|p| name.starts_with(p))
    }
}

/// A URL's parts as the key reads them.
struct Parts<'a> {
    scheme: &'a str,
    host: Cow<'a, str>,
    port: Option<u32>,
    path: &'a str,
    query: &'a str,
}

/// The parts of a plain URL: `(https?)://[A-Za-z0-9._-]+(:[0-9]{1,5})?([/?][!-"$-~]*)?`,
/// whole; None for any other.
fn plain_parts(url: &str) -> Option<Parts<'_>> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("https://") {
        ("https", rest)
    } else {
        ("http", url.strip_prefix("http://")?)
    };
    let host_end = rest
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || b"._-".contains(&b)))
        .unwrap_or(rest.len());
    let (host, mut after) = rest.split_at(host_end);
    let mut port = None;
    if let Some(digits) = after.strip_prefix(':') {
        let end = digits
            .bytes()
            .position(|b| !b.is_ascii_digit())
            .unwrap_or(digits.len());
        if !(1..=5).contains(&end) {
            return None;
        }
        port = Some(digits[..end].parse().ok()?);
        after = &digits[end..];
    }
    let printable = |b: u8| (b'!'..=b'~').contains(&b) && b != b'#';
    if !after.is_empty() && (!after.starts_with(['/', '?']) || !after.bytes().all(printable)) {
        return None;
    }
    let host = host.trim_end_matches('.');
    if host.is_empty() || port.is_some_and(|port| port > 65535) {
        return None;
    }
    let (path, query) = after.split_once('?').unwrap_or((after, ""));
    let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    };
    Some(Parts {
        scheme,
        host,
        port,
        path,
        query,
    })
}

/// A query parameter's name as `urllib.parse.unquote_plus` decodes it, lower-cased.
fn parameter_name(item: &str) -> String {
    let name = item.split('=').next().unwrap_or_default().as_bytes();
    let mut bytes = Vec::with_capacity(name.len());
    let mut i = 0;
    while i < name.len() {
        let hex = |at: usize| name.get(at).and_then(|&b| (b as char).to_digit(16));
        match (name[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                bytes.push((high * 16 + low) as u8);
                i += 3;
                continue;
            }
            (b'+', _, _) => bytes.push(b' '),
            (byte, _, _) => bytes.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&bytes).to_lowercase()
}

/// A host's family, by its index in the families: Python's (`sidecar.cache.policy`).
type FamilyOf = Box<dyn Fn(&str) -> Option<usize> + Send + Sync>;

/// The rules, as the core uses them.
pub struct Rules {
    families: Vec<Signing>,
    family_of: FamilyOf,
    known: Mutex<HashMap<String, Option<usize>>>,
}

/// The rules, as Python makes and uses them.
#[pyclass(module = "sidecar.core.native", frozen)]
pub struct KeyRules(pub Arc<Rules>);

impl Rules {
    fn of(families: Vec<(Vec<String>, Vec<String>)>, family_of: FamilyOf) -> Self {
        let families = families
            .into_iter()
            .map(|(names, prefixes)| Signing { names, prefixes })
            .collect();
        Self {
            families,
            family_of,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// The family `host` belongs to, asked of Python once per host.
    fn family(&self, host: &str) -> Option<&Signing> {
        let lock = || self.known.lock().unwrap_or_else(|poison| poison.into_inner());
        let known = lock().get(host).copied();
        let index = match known {
            Some(index) => index,
            None => {
                let index = (self.family_of)(host);
                let mut known = lock();
                if known.len() >= HOSTS {
                    known.clear();
                }
                known.insert(host.to_owned(), index);
                index
            }
        };
        index.and_then(|index| self.families.get(index))
    }

    fn key(&self, parts: &Parts<'_>) -> String {
        let Parts {
            scheme,
            host,
            port,
            path,
            query,
        } = parts;
        let default = if *scheme == "https" { 443 } else { 80 };
        let mut key = String::with_capacity(scheme.len() + host.len() + path.len() + 16);
        key.push_str(scheme);
        key.push_str("://");
        key.push_str(host);
        if let Some(port) = port.filter(|&port| port != default) {
            key.push(':');
            key.push_str(&port.to_string());
        }
        key.push_str(if path.is_empty() { "/" } else { path });
        if !query.is_empty() {
            let family = self.family(host);
            let mut first = true;
            for item in query.split('&') {
                if item.is_empty() || family.is_some_and(|f| f.signs(&parameter_name(item))) {
                    continue;
                }
                key.push(if first { '?' } else { '&' });
                key.push_str(item);
                first = false;
            }
        }
        key
    }

    /// The key of a plain URL; None for any other, which is Python's to split.
    pub fn plain_key(&self, url: &str) -> Option<String> {
        plain_parts(url).map(|parts| self.key(&parts))
    }
}

#[pymethods]
impl KeyRules {
    /// Rules with these signing `families` (each its lower-case parameter names and
    /// name prefixes) and `family_of(host)`: the index of the family a lower-case host
    /// belongs to, or None (a function of the host alone, holding nothing that holds
    /// the rules). Should it raise, the error is reported as unraisable and the host
    /// has no family: its signing parameters stay in its keys, as on any other host.
    #[new]
    fn new(families: Vec<(Vec<String>, Vec<String>)>, family_of: Py<PyAny>) -> Self {
        let family_of = move |host: &str| {
            Python::attach(|py| {
                let family = family_of.call1(py, (host,));
                family.and_then(|index| index.extract(py)).unwrap_or_else(|error| {
                    error.write_unraisable(py, None);
                    None
                })
            })
        };
        Self(Arc::new(Rules::of(families, Box::new(family_of))))
    }

    /// The key of a plain URL; None for any other.
    #[pyo3(name = "key")]
    fn py_key(&self, url: &str) -> Option<String> {
        self.0.plain_key(url)
    }

    /// The key of a URL split elsewhere: `host` lower-case, without a trailing dot.
    #[pyo3(signature = (scheme, host, port, path, query))]
    fn key_of_parts(
        &self,
        scheme: &str,
        host: &str,
        port: Option<u32>,
        path: &str,
        query: &str,
    ) -> String {
        let parts = Parts {
            scheme,
            host: Cow::Borrowed(host),
            port,
            path,
            query,
        };
        self.0.key(&parts)
    }
}

/// A key's digest (`digest`), for Python's index.
#[pyfunction]
#[pyo3(name = "key_digest")]
pub fn py_key_digest(key: &[u8]) -> Vec<u8> {
    digest(key).to_vec()
}

/// Rules with one family, a part of S3's, for the tests.
#[cfg(test)]
pub fn rules_for_tests() -> Rules {
    let s3 = (vec!["x-amz-signature".into(), "expires".into()], vec!["x-amz-".into()]);
    let family_of = |host: &str| host.ends_with(".amazonaws.com").then_some(0);
    Rules::of(vec![s3], Box::new(family_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(url: &str) -> Option<String> {
        rules_for_tests().plain_key(url)
    }

    #[test]
    fn plain_urls_are_normalised() {
        let cases = [
            ("https://Example.COM./a/b?x=1", "https://example.com/a/b?x=1"),
            ("http://h:80/f", "http://h/f"),
            ("https://h:443", "https://h/"),
            ("https://h:0443/f", "https://h/f"),
            ("https://h:08443/f", "https://h:8443/f"),
            ("http://h?&a=1&&b", "http://h/?a=1&b"),
            ("http://h/f?", "http://h/f"),
            ("http://h/%7Euser/../f", "http://h/%7Euser/../f"),
        ];
        for (url, expected) in cases {
            assert_eq!(key(url).as_deref(), Some(expected), "{url}");
        }
    }

    #[test]
    fn signing_parameters_go_on_their_family_only() {
        let signed = "https://b.s3.amazonaws.com/k?versionId=3&X-Amz-Date=1&x%2Damz%2Dsignature=2";
        assert_eq!(
            key(&format!("{signed}&Expires=9")).as_deref(),
            Some("https://b.s3.amazonaws.com/k?versionId=3")
        );
        assert_eq!(
            key("https://other.org/k?X-Amz-Date=1&Expires=9").as_deref(),
            Some("https://other.org/k?X-Amz-Date=1&Expires=9")
        );
    }

    #[test]
    fn other_urls_are_left_to_python() {
        for url in [
            "HTTP://h/f",
            "ftp://h/f",
            "http://",
            "http://.../f",
            "http://h:/f",
            "http://h:123456/f",
            "http://h:99999/f",
            "http://h/f#frag",
            "http://h/a b",
            "http://u@h/f",
            "http://[::1]/f",
            "http://h/caf\u{e9}",
        ] {
            assert_eq!(key(url), None, "{url}");
        }
    }

    #[test]
    fn names_are_decoded_as_unquote_plus_does() {
        assert_eq!(parameter_name("X%2DAmz+Date=1"), "x-amz date");
        assert_eq!(parameter_name("%zz%4=1"), "%zz%4");
        // U+212A KELVIN SIGN lower-cases to an ASCII k, in Python as here.
        assert_eq!(parameter_name("%E2%84%AAey=1"), "key");
    }

    #[test]
    fn the_digest_is_blake2b_of_sixteen_bytes() {
        // Python's hashlib.blake2b(b"https://h/f", digest_size=16).hexdigest()
        let hex: String = digest(b"https://h/f").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "dbcbeaa05fb6b33f84a307bac5fc5b7f");
    }
}
