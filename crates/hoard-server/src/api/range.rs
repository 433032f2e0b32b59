//! `Range` / `x-ms-range` on downloads (PROTOCOL.md §4.3, RFC 9110 §14).
//!
//! One range per request: `bytes=a-b`, `bytes=a-` and `bytes=-n`. A header that does not parse,
//! or asks for several ranges, is ignored and the whole entry is served, as RFC 9110 allows.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeRequest {
    Full,
    /// Bytes `[start, start + len)`, with `len > 0`.
    Partial {
        start: u64,
        len: u64,
    },
    /// Answer 416 with `Content-Range: bytes */size`.
    Unsatisfiable,
}

pub fn resolve(header: Option<&str>, size: u64) -> RangeRequest {
    let Some(spec) = header.map(str::trim).and_then(|h| h.strip_prefix("bytes=")) else {
        return RangeRequest::Full;
    };
    if spec.contains(',') {
        return RangeRequest::Full;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeRequest::Full;
    };
    let parse = |s: &str| -> Option<u64> {
        let s = s.trim();
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (first.trim().is_empty(), parse(first), parse(last)) {
        // bytes=-n: the last n bytes.
        (true, _, Some(n)) => {
            if n == 0 || size == 0 {
                RangeRequest::Unsatisfiable
            } else {
                let len = n.min(size);
                RangeRequest::Partial {
                    start: size - len,
                    len,
                }
            }
        }
        (false, Some(start), end) if last.trim().is_empty() || end.is_some() => {
            if end.is_some_and(|e| e < start) {
                return RangeRequest::Full;
            }
            if start >= size {
                return RangeRequest::Unsatisfiable;
            }
            let end = end.map_or(size - 1, |e| e.min(size - 1));
            RangeRequest::Partial {
                start,
                len: end - start + 1,
            }
        }
        _ => RangeRequest::Full,
    }
}

#[cfg(test)]
mod tests {
    use super::{resolve, RangeRequest::*};

    #[test]
    fn closed_open_and_suffix_ranges() {
        assert_eq!(resolve(Some("bytes=0-0"), 10), Partial { start: 0, len: 1 });
        assert_eq!(
            resolve(Some("bytes=0-4194303"), 10_000_000),
            Partial {
                start: 0,
                len: 4_194_304
            }
        );
        assert_eq!(resolve(Some("bytes=5-"), 10), Partial { start: 5, len: 5 });
        assert_eq!(resolve(Some("bytes=-3"), 10), Partial { start: 7, len: 3 });
        assert_eq!(
            resolve(Some("bytes=-30"), 10),
            Partial { start: 0, len: 10 }
        );
    }

    #[test]
    fn ranges_past_the_end_are_clamped_or_unsatisfiable() {
        assert_eq!(
            resolve(Some("bytes=8-100"), 10),
            Partial { start: 8, len: 2 }
        );
        assert_eq!(resolve(Some("bytes=10-"), 10), Unsatisfiable);
        assert_eq!(resolve(Some("bytes=10-20"), 10), Unsatisfiable);
        assert_eq!(resolve(Some("bytes=0-0"), 0), Unsatisfiable);
        assert_eq!(resolve(Some("bytes=-0"), 10), Unsatisfiable);
    }

    #[test]
    fn malformed_or_multiple_ranges_serve_everything() {
        for bad in [
            "bytes=5-2",
            "bytes=a-b",
            "bytes=",
            "bytes=-",
            "items=0-1",
            "bytes=0-1,3-4",
            "bytes=+1-2",
            "bytes=1",
        ] {
            assert_eq!(resolve(Some(bad), 10), Full, "{bad}");
        }
        assert_eq!(resolve(None, 10), Full);
    }
}
