//! What a fill keeps of an origin's response, for the common case only: the narrow part
//! of `sidecar.cache.policy.judge_response` that dataset origins answer with (nginx's,
//! S3's: a 200 with a Content-Length, dates, an ETag, nothing that bears on freshness).
//!
//! The common case is a 200 of HTTP/1.1 or 1.0 with one `Content-Length` of digits, at
//! most one `Date`, `Last-Modified` and `ETag` (the dates IMF-fixdates as RFC 9110 spells
//! them), a `Connection` of tokens if any, and none of the other fields Python's
//! judgement reads (`DEFERRED`: transfer codings, content codings, `Vary`,
//! `Cache-Control`, `Expires`, `Age`). For it the judgement is: stored, with
//! the fields replayed and relayed as Python's sets of names say (installed by Python,
//! `JudgeRules`), the moment the origin generated it (RFC 9111 §4.2.3, with no `Age`)
//! and its heuristic freshness (a tenth of the time since `Last-Modified`, §4.2.2). Any
//! other response is Python's to judge (`None`), whatever the verdict would be. A
//! property test (`tests/sidecar/test_policy.py`) holds that every response judged here
//! is judged alike by Python.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// The fields whose rules are Python's alone: a response with any of them is not judged
/// here.
const DEFERRED: [&str; 6] = [
    "transfer-encoding",
    "content-encoding",
    "vary",
    "cache-control",
    "expires",
    "age",
];
/// Significant digits of the longest `Content-Length` read here (a u64 holds 19 of some).
const LENGTH_DIGITS: usize = 18;

/// What a fill keeps of a response judged storable (`policy.Kept`, field by field).
#[derive(Debug, PartialEq)]
pub struct Kept {
    pub size: u64,
    pub stored: Vec<(String, String)>,
    pub relayed: Vec<(String, String)>,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub generated_at: f64,
    pub lifetime: f64,
}

/// The names Python keeps (`sidecar.cache.policy`), lower-case.
pub struct Rules {
    /// Never replayed from a stored response (`_NOT_REPLAYED`).
    not_replayed: Vec<String>,
    /// Never relayed to the client whose request started the fill (`_relayed`).
    not_relayed: Vec<String>,
    /// A prefix of names never replayed (the CORS fields).
    not_replayed_prefix: String,
}

/// The one value of a field that must appear at most once: None if absent, Err if
/// repeated.
fn single<'a>(lines: &'a [(String, String)], name: &str) -> Result<Option<&'a str>, ()> {
    let mut found = None;
    for (field, value) in lines {
        if field.eq_ignore_ascii_case(name) {
            if found.is_some() {
                return Err(());
            }
            found = Some(value.as_str());
        }
    }
    Ok(found)
}

/// A Content-Length of digits alone, as `wire.fields.parse_length` reads it.
fn length(value: &str) -> Option<u64> {
    let significant = value.trim_start_matches('0');
    let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    (digits && significant.len() <= LENGTH_DIGITS).then(|| significant.parse().unwrap_or(0))
}

/// The seconds since the epoch of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) in
/// the case RFC 9110 spells it, of a moment that exists (a leap second counts as the
/// second before); None for anything else.
pub fn imf_fixdate(value: &str) -> Option<f64> {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let bytes = value.as_bytes();
    if bytes.len() != 29 || !value.is_ascii() || !value.ends_with(" GMT") {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = &value[range];
        digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse().ok())?
    };
    let layout = [(3, b','), (4, b' '), (7, b' '), (11, b' '), (16, b' '), (19, b':'), (22, b':')];
    if !DAYS.contains(&&value[..3]) || layout.iter().any(|&(at, byte)| bytes[at] != byte) {
        return None;
    }
    let month = MONTHS.iter().position(|&m| m == &value[8..11])? as i64 + 1;
    let (day, year) = (number(5..7)?, number(12..16)?);
    let (hour, minute, second) = (number(17..19)?, number(20..22)?, number(23..25)?);
    if year < 1 || day < 1 || day > days_in(year, month) || hour > 23 || minute > 59 {
        return None;
    }
    let seconds = days_since_epoch(year, month, day) * 86_400
        + hour * 3_600
        + minute * 60
        + second.min(59);
    Some(seconds as f64)
}

fn days_in(year: i64, month: i64) -> i64 {
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
fn days_since_epoch(year: i64, month: i64, day: i64) -> i64 {
    // Howard Hinnant's days_from_civil: years counted from March, in eras of 400.
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let of_era = year - era * 400;
    let shifted_month = (month + 9) % 12;
    let of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let of_era_days = of_era * 365 + of_era / 4 - of_era / 100 + of_year;
    era * 146_097 + of_era_days - 719_468
}

/// The field names a `Connection` value names, lower-case; None if it is not a plain
/// list of tokens.
fn connection_names(value: &str, names: &mut Vec<String>) -> Option<()> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    for member in value.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if !member.bytes().all(token) {
            return None;
        }
        if !member.is_empty() {
            names.push(member.to_ascii_lowercase());
        }
    }
    Some(())
}

impl Rules {
    /// The judgement of a response to a fill's GET, asked at `requested` and come at
    /// `received` (seconds since the epoch): what is kept, or None when its head is not
    /// the common case, which is then Python's to judge.
    pub fn judge(
        &self,
        status: u16,
        version: &str,
        lines: &[(String, String)],
        requested: f64,
        received: f64,
    ) -> Option<Kept> {
        if status != 200 || !(version == "1.1" || version == "1.0") {
            return None;
        }
        let mut named = Vec::new();
        for (name, value) in lines {
            if DEFERRED.iter().any(|d| name.eq_ignore_ascii_case(d)) {
                return None;
            }
            if name.eq_ignore_ascii_case("connection") {
                connection_names(value, &mut named)?;
            }
        }
        let size = length(single(lines, "content-length").ok()??)?;
        let date = match single(lines, "date").ok()? {
            Some(date) => Some(imf_fixdate(date)?),
            None => None,
        };
        let etag = single(lines, "etag").ok()?;
        let last_modified = single(lines, "last-modified").ok()?;
        let modified = match last_modified {
            Some(value) => Some(imf_fixdate(value)?),
            None => None,
        };
        let kept = |dropped: &[String], prefix: Option<&str>| -> Vec<(String, String)> {
            lines
                .iter()
                .filter(|(name, _)| {
                    let lowered = name.to_ascii_lowercase();
                    !dropped.contains(&lowered)
                        && !named.contains(&lowered)
                        && prefix.is_none_or(|prefix| !lowered.starts_with(prefix))
                })
                .cloned()
                .collect()
        };
        let stored = kept(&self.not_replayed, Some(&self.not_replayed_prefix));
        let relayed = kept(&self.not_relayed, None);
        // RFC 9111 §4.2.3 without an Age: the later of the Date's and the round trip's.
        let apparent = date.map_or(0.0, |date| (received - date).max(0.0));
        let corrected = received - requested;
        // The heuristic lifetime reads the stored Last-Modified, which a Connection may
        // have named away.
        let stored_modified = stored
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("last-modified"));
        let lifetime = match modified.filter(|_| stored_modified) {
            Some(modified) => ((date.unwrap_or(received) - modified) / 10.0).max(0.0),
            None => 0.0,
        };
        Some(Kept {
            size,
            stored,
            relayed,
            etag: etag.map(str::to_owned),
            last_modified: last_modified.map(str::to_owned),
            generated_at: received - apparent.max(corrected),
            lifetime,
        })
    }
}

/// The common case's judgement, with the names Python keeps.
#[pyclass(module = "sidecar.core.native", frozen)]
pub struct JudgeRules(pub Rules);

#[pymethods]
impl JudgeRules {
    /// Rules that never replay the fields named in `not_replayed` (lower-case) nor those
    /// whose names begin with `not_replayed_prefix`, and never relay those in
    /// `not_relayed`.
    #[new]
    fn new(
        not_replayed: Vec<String>,
        not_replayed_prefix: String,
        not_relayed: Vec<String>,
    ) -> Self {
        Self(Rules {
            not_replayed,
            not_relayed,
            not_replayed_prefix,
        })
    }

    /// What a fill keeps of this response (`policy.Kept`'s fields, its field lists as
    /// tuples), or None when it is not the common case.
    fn judge<'py>(
        &self,
        py: Python<'py>,
        status: u16,
        version: &str,
        lines: Vec<(String, String)>,
        requested: f64,
        received: f64,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(kept) = self.0.judge(status, version, &lines, requested, received) else {
            return Ok(None);
        };
        let stored = PyTuple::new(py, kept.stored)?;
        let relayed = PyTuple::new(py, kept.relayed)?;
        let fields = (
            kept.size,
            stored,
            relayed,
            kept.etag,
            kept.last_modified,
            kept.generated_at,
            kept.lifetime,
        );
        Ok(Some(fields.into_pyobject(py)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        let names = |text: &str| text.split(' ').map(str::to_owned).collect();
        Rules {
            not_replayed: names("connection keep-alive content-length age set-cookie alt-svc"),
            not_relayed: names("connection keep-alive content-length alt-svc"),
            not_replayed_prefix: "access-control-".to_owned(),
        }
    }

    fn lines(text: &[(&str, &str)]) -> Vec<(String, String)> {
        text.iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    const NGINX: [(&str, &str); 7] = [
        ("Server", "nginx"),
        ("Date", "Mon, 07 Dec 2026 23:00:00 GMT"),
        ("Content-Length", "16384"),
        ("Last-Modified", "Mon, 07 Dec 2026 22:00:00 GMT"),
        ("Connection", "keep-alive"),
        ("ETag", "\"6571b2c0-4000\""),
        ("Set-Cookie", "a=b"),
    ];

    #[test]
    fn an_origins_common_head_is_stored_as_python_would_store_it() {
        let date = imf_fixdate("Mon, 07 Dec 2026 23:00:00 GMT").unwrap();
        let kept = rules()
            .judge(200, "1.1", &lines(&NGINX), date - 0.5, date + 0.25)
            .expect("the common case");
        assert_eq!(kept.size, 16384);
        let names = |fields: &[(String, String)]| -> Vec<String> {
            fields.iter().map(|(name, _)| name.clone()).collect()
        };
        assert_eq!(names(&kept.stored), ["Server", "Date", "Last-Modified", "ETag"]);
        assert_eq!(
            names(&kept.relayed),
            ["Server", "Date", "Last-Modified", "ETag", "Set-Cookie"]
        );
        assert_eq!(kept.etag.as_deref(), Some("\"6571b2c0-4000\""));
        // The round trip (0.75 s) is longer than the Date's age (0.25 s).
        assert_eq!(kept.generated_at, date - 0.5);
        assert_eq!(kept.lifetime, 360.0);
    }

    #[test]
    fn anything_else_is_pythons() {
        let with = |extra: (&str, &str)| {
            let mut head = lines(&NGINX);
            head.push((extra.0.to_owned(), extra.1.to_owned()));
            rules().judge(200, "1.1", &head, 0.0, 1.0)
        };
        for extra in [
            ("Cache-Control", "max-age=60"),
            ("vary", "Accept-Encoding"),
            ("Age", "3"),
            ("Content-Length", "16384"),
            ("Date", "Mon, 07 Dec 2026 23:00:00 GMT"),
            ("Connection", "\"quoted\""),
            ("Transfer-Encoding", "chunked"),
        ] {
            assert_eq!(with(extra), None, "{extra:?}");
        }
        assert!(rules().judge(206, "1.1", &lines(&NGINX), 0.0, 1.0).is_none());
        assert!(rules().judge(200, "2", &lines(&NGINX), 0.0, 1.0).is_none());
        let mut no_length = lines(&NGINX);
        no_length.retain(|(name, _)| name != "Content-Length");
        assert!(rules().judge(200, "1.1", &no_length, 0.0, 1.0).is_none());
    }

    #[test]
    fn imf_fixdates_are_read_as_python_reads_them_or_left_to_it() {
        assert_eq!(imf_fixdate("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0.0));
        assert_eq!(
            imf_fixdate("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777.0)
        );
        assert_eq!(
            imf_fixdate("Thu, 29 Feb 2024 23:59:60 GMT"),
            Some(1_709_251_199.0)
        );
        for other in [
            "Fri, 30 Feb 2024 00:00:00 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 0000 08:49:37 GMT",
        ] {
            assert_eq!(imf_fixdate(other), None, "{other}");
        }
    }

    #[test]
    fn lengths_are_digits_alone() {
        assert_eq!(length("0"), Some(0));
        assert_eq!(length("000123"), Some(123));
        assert_eq!(length("999999999999999999"), Some(999_999_999_999_999_999));
        for other in ["", "1 2", "+1", "1,1", "1234567890123456789", " 1"] {
            assert_eq!(length(other), None, "{other}");
        }
    }
}
