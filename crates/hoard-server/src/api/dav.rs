//! Files over WebDAV under `/_dav/`, as sccache's `webdav` backend
//! (`SCCACHE_WEBDAV_ENDPOINT=<hoard's URL>/_dav/sccache`) and ccache's `http` remote storage
//! (`remote_storage = http://…/_dav/ccache|layout=subdirs`) use it: `GET`, `HEAD` and `PUT` of a
//! file, `MKCOL` (directories are implied by the files' names, so it only says whether the
//! caller may write) and `PROPFIND` (a file's size, or a directory). Each file is an object of
//! the job's repository and scope ([`crate::cache::tools`]); the job's runtime token is the
//! bearer credential, or the password of Basic credentials (ccache sends those from the URL).
//! Paths are matched case-insensitively, as cache keys are: `Foo` and `foo` are one file (the
//! tools name files by lower-case hashes).

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use super::origin::ClientAddress;
use super::{objects, AppState};
use crate::model::{Tool, ToolObject};

pub const BASE: &str = "/_dav/";

/// The longest path taken under `/_dav/` (keys are at most 512 characters with the tool's
/// name before them).
const MAX_PATH: usize = 400;

pub async fn serve(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    ClientAddress(address): ClientAddress,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = uri.path().strip_prefix(BASE).unwrap_or_default();
    let Some(target) = Target::parse(path) else {
        return objects::plain(
            StatusCode::BAD_REQUEST,
            "a path under /_dav/ is at most 400 characters of names of letters, digits, '.', \
             '_' and '-', separated by '/'",
        );
    };
    if method == Method::OPTIONS {
        return (
            StatusCode::OK,
            [
                (header::ALLOW, "OPTIONS, GET, HEAD, PUT, MKCOL, PROPFIND"),
                (header::HeaderName::from_static("dav"), "1"),
            ],
        )
            .into_response();
    }
    let caller = match objects::plain_caller(&app, &headers, address).await {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let not_found = || objects::plain(StatusCode::NOT_FOUND, "not found");
    match (method.as_str(), target) {
        ("GET" | "HEAD" | "PUT", Target::File(name)) => {
            let object = ToolObject::bare(Tool::WebDav);
            // A file written anew, or one that was there (WebDAV's answer to a replacement).
            let taken = objects::Taken {
                saved: StatusCode::CREATED,
                present: StatusCode::NO_CONTENT,
            };
            let request = (&method, &headers, body);
            objects::plain_object(&app, &caller, &object, name, request, taken, None)
                .await
                .unwrap_or_else(not_found)
        }
        ("MKCOL", _) => match caller.identity.write_scope {
            Some(_) => objects::plain(StatusCode::CREATED, ""),
            None => objects::plain(StatusCode::FORBIDDEN, "this token writes nowhere"),
        },
        ("PROPFIND", Target::Directory) => multistatus(uri.path(), None, None),
        ("PROPFIND", Target::File(name)) => {
            match objects::serve(&app, &caller, Tool::WebDav, name, &Method::HEAD, &headers).await {
                Ok(Some(found)) => {
                    let shown = |name| {
                        found
                            .headers()
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned)
                    };
                    let len = shown(header::CONTENT_LENGTH).unwrap_or_else(|| "0".into());
                    multistatus(uri.path(), Some(&len), shown(header::LAST_MODIFIED))
                }
                Ok(None) => not_found(),
                Err(e) => objects::plain_refusal(e),
            }
        }
        _ => objects::plain(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not served here (files go by hoard's lifecycle)"),
        ),
    }
}

/// What a path under `/_dav/` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target<'a> {
    /// The root, or a path ending in `/`.
    Directory,
    File(&'a str),
}

impl<'a> Target<'a> {
    fn parse(path: &'a str) -> Option<Self> {
        let name_ok = |name: &str| {
            !name.is_empty()
                && name != "."
                && name != ".."
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        };
        if path.len() > MAX_PATH {
            return None;
        }
        let (names, directory) = match path.strip_suffix('/') {
            Some(dir) => (dir, true),
            None => (path, path.is_empty()),
        };
        if !names.is_empty() && !names.split('/').all(name_ok) {
            return None;
        }
        Some(if directory {
            Self::Directory
        } else {
            Self::File(names)
        })
    }
}

/// A `207 Multi-Status` for `href`: a file of `len` bytes, or a directory, last modified at
/// `modified` (an HTTP date; now if unknown, as a directory's is).
fn multistatus(href: &str, len: Option<&str>, modified: Option<String>) -> Response {
    let modified =
        modified.unwrap_or_else(|| httpdate::fmt_http_date(std::time::SystemTime::now()));
    let kind = match len {
        Some(len) => format!("<D:resourcetype/><D:getcontentlength>{len}</D:getcontentlength>"),
        None => "<D:resourcetype><D:collection/></D:resourcetype>".into(),
    };
    let props = format!("{kind}<D:getlastmodified>{modified}</D:getlastmodified>");
    // The path was checked: nothing in it needs escaping in XML.
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<D:multistatus xmlns:D=\"DAV:\"><D:response>\
         <D:href>{href}</D:href><D:propstat><D:prop>{props}</D:prop>\
         <D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response></D:multistatus>"
    );
    (
        StatusCode::MULTI_STATUS,
        [(header::CONTENT_TYPE, "application/xml; charset=utf-8")],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn paths_name_files_or_directories_and_nothing_else() {
        assert_eq!(Target::parse(""), Some(Target::Directory));
        assert_eq!(Target::parse("sccache/a/b/"), Some(Target::Directory));
        assert_eq!(
            Target::parse("sccache/a/b/c/abc123"),
            Some(Target::File("sccache/a/b/c/abc123"))
        );
        assert_eq!(
            Target::parse(".sccache_check"),
            Some(Target::File(".sccache_check"))
        );
        for bad in [
            "../x",
            "a/../b",
            "a//b",
            "a/./b",
            "a b",
            "a%2Fb",
            &"x".repeat(401),
        ] {
            assert_eq!(Target::parse(bad), None, "{bad}");
        }
    }
}
