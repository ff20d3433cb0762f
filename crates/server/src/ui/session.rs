//! The web UI's session on the TCP listener (docs/ui.md,
//! docs/decisions/ui-and-mcp.md "The web UI"). A browser cannot send
//! the bearer header on a page load, so the first visit carries the token
//! once in the URL (`/ui?token=…`): it is checked in constant time, answered
//! with a cookie and a redirect to the URL without it. The cookie then
//! stands for the token: `HttpOnly` (no script reads it), `SameSite=Strict`
//! (no other site's request carries it) and its name the port's (two daemons
//! on one host do not overwrite each other's). Its value is a session of its
//! own (issue 24): 256 random bits from the kernel, kept by the server (only
//! its hash, in memory), ended by `POST /api/ui/logout`, after
//! [`UiLimits::idle`] without a request and after [`UiLimits::max`] whatever
//! happens, and by a restart of the daemon. A cookie read off a disk or a
//! proxy log is worth nothing once its session ended.
//!
//! A mutation the cookie authenticates must also carry `X-Brood-Csrf: 1`,
//! which no cross-site form can send and no cross-origin script can send
//! without a CORS preflight this server never grants; and its
//! `Sec-Fetch-Site` and `Origin`, when the browser sends them, must say the
//! request came from this origin.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header::{COOKIE, HOST, LOCATION, ORIGIN, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use brood_core::Code;
use brood_runtime::ApiError;

use crate::error::HttpError;
use crate::state::Api;

/// The header a cookie-authenticated mutation must carry.
pub(crate) const CSRF_HEADER: &str = "x-brood-csrf";

/// What the cookie says about a request.
pub(crate) enum ByCookie {
    /// No cookie of this listener: the request is not the UI's.
    Absent,
    /// A valid cookie, and the request may act with it.
    Operator,
    /// A cookie, but the request is refused (wrong or stale cookie, or a
    /// mutation without the cross-site protection).
    Refused(Response),
}

/// The cookie's name: one per port, since cookies are not kept apart by port.
fn cookie_name(headers: &HeaderMap) -> String {
    let port = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.rsplit_once(':'))
        .map(|(_, p)| p)
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    match port {
        Some(p) => format!("brood_ui_{p}"),
        None => "brood_ui".to_owned(),
    }
}

fn presented_cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_owned())
}

/// The paths a browser opens as pages (the others are the API and assets).
pub(crate) fn is_page(path: &str) -> bool {
    path == "/" || path == "/ui" || path.starts_with("/ui/")
}

/// `GET /?token=…` or `GET /ui?token=…`: the first visit. `None` when the
/// request is not one.
pub(crate) fn login(api: &Api, req: &Request) -> Option<Response> {
    let token = api.0.token.as_ref();
    let path = req.uri().path();
    if req.method() != Method::GET || !(path == "/" || path == "/ui") {
        return None;
    }
    let presented = req
        .uri()
        .query()?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "token")
        .map(|(_, v)| v.trim())?;
    let ok = token.is_some_and(|t| t.matches(presented));
    if !ok {
        return Some(refused_page(
            "The token in this address is wrong. Open the address again with the token of $BROOD_ROOT/token.",
        ));
    }
    let sessions = &api.0.ui_sessions;
    let value = match sessions.open() {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(error = %e, "making a UI session");
            return Some(refused_page(
                "the session could not be made (see the daemon's log)",
            ));
        }
    };
    // The browser forgets it at the session's absolute end, as the server does.
    let cookie = format!(
        "{}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        cookie_name(req.headers()),
        sessions.limits().max.as_secs()
    );
    let mut r = StatusCode::SEE_OTHER.into_response();
    let h = r.headers_mut();
    // The token leaves the address bar (and the history) at once.
    h.insert(LOCATION, HeaderValue::from_static("/ui"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    match HeaderValue::from_str(&cookie) {
        Ok(v) => {
            h.insert(SET_COOKIE, v);
        }
        Err(_) => return Some(refused_page("the session cookie could not be made")),
    }
    Some(r)
}

/// The cookie's verdict on a TCP request without a bearer token.
pub(crate) fn by_cookie(api: &Api, req: &Request) -> ByCookie {
    let headers = req.headers();
    let Some(presented) = presented_cookie(headers, &cookie_name(headers)) else {
        return ByCookie::Absent;
    };
    if api.0.token.is_none() {
        return ByCookie::Absent;
    }
    if !api.0.ui_sessions.check(&presented) {
        let l = api.0.ui_sessions.limits();
        return ByCookie::Refused(unauthorized(
            req,
            &format!(
                "the UI's session has ended (logged out, {} without a request, {} since it began, or the daemon restarted): open /ui?token=… again",
                span(l.idle),
                span(l.max)
            ),
        ));
    }
    let m = req.method();
    if m == Method::GET || m == Method::HEAD {
        return ByCookie::Operator;
    }
    match cross_site(headers) {
        None => ByCookie::Operator,
        Some(why) => ByCookie::Refused(
            HttpError(ApiError::new(
                Code::Forbidden,
                format!("a mutation authenticated by the UI's cookie {why}"),
            ))
            .into_response(),
        ),
    }
}

/// A limit as people say it.
fn span(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 && s.is_multiple_of(3600) {
        format!("{} h", s / 3600)
    } else if s >= 60 && s.is_multiple_of(60) {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

#[utoipa::path(
    post, path = "/api/ui/logout", tag = "ui",
    responses(
        (status = 204, description = "The UI's session of the cookie sent (if any) has ended; the browser is told to forget the cookie. A cookie-authenticated logout needs `X-Brood-Csrf: 1` like every mutation."),
    )
)]
/// `POST /api/ui/logout`: the session of the cookie sent ends now, and the
/// browser is told to drop it. Behind the same authentication as every
/// route (so a cookie-authenticated logout needs the cross-site header).
pub(crate) async fn logout(State(api): State<Api>, headers: HeaderMap) -> Response {
    let name = cookie_name(&headers);
    if let Some(v) = presented_cookie(&headers, &name) {
        api.0.ui_sessions.close(&v);
    }
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{name}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"
    )) {
        h.insert(SET_COOKIE, v);
    }
    r
}

/// Why a cookie-authenticated mutation may come from another site, if it may.
fn cross_site(headers: &HeaderMap) -> Option<String> {
    let header = |n| headers.get(n).and_then(|v: &HeaderValue| v.to_str().ok());
    if header(CSRF_HEADER) != Some("1") {
        return Some(
            "needs the header `X-Brood-Csrf: 1` (no cross-site form can send it); the bearer token needs none"
                .to_owned(),
        );
    }
    if let Some(site) = header("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
    {
        return Some(format!("came from another site (Sec-Fetch-Site: {site})"));
    }
    if let (Some(origin), Some(host)) = (header(ORIGIN.as_str()), header(HOST.as_str()))
        && origin != format!("http://{host}")
    {
        return Some(format!(
            "came from another origin ({origin}, not http://{host})"
        ));
    }
    None
}

/// 401 for a request with neither token nor cookie: a small page for a
/// browser's page load, the API's JSON error otherwise.
pub(crate) fn unauthorized(req: &Request, message: &str) -> Response {
    if req.method() == Method::GET && is_page(req.uri().path()) {
        refused_page(message)
    } else {
        HttpError(ApiError::new(Code::Unauthorized, message.to_owned())).into_response()
    }
}

/// The page a browser is shown without the token: what to do, no data.
pub(crate) fn refused_page(message: &str) -> Response {
    let body = super::assets::REFUSED.replace("{message}", &super::escape_html(message));
    super::page(StatusCode::UNAUTHORIZED, "text/html; charset=utf-8", body)
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use std::time::Duration;

    use super::{cookie_name, cross_site, presented_cookie, span};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_cookie_is_named_after_the_port() {
        assert_eq!(
            cookie_name(&headers(&[("host", "127.0.0.1:8420")])),
            "brood_ui_8420"
        );
        assert_eq!(cookie_name(&headers(&[("host", "x:a")])), "brood_ui");
        assert_eq!(
            presented_cookie(&headers(&[("cookie", "a=1; brood_ui_1=xyz")]), "brood_ui_1"),
            Some("xyz".to_owned())
        );
    }

    #[test]
    fn a_mutation_needs_the_header_and_a_same_origin() {
        let ok = [("x-brood-csrf", "1"), ("host", "127.0.0.1:9")];
        assert_eq!(cross_site(&headers(&ok)), None);
        assert!(cross_site(&headers(&[("host", "127.0.0.1:9")])).is_some());
        let mut h = headers(&ok);
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(cross_site(&h).unwrap().contains("cross-site"));
        let mut h = headers(&ok);
        h.insert("origin", HeaderValue::from_static("http://evil.example"));
        assert!(cross_site(&h).unwrap().contains("evil.example"));
        let mut h = headers(&ok);
        h.insert("origin", HeaderValue::from_static("http://127.0.0.1:9"));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert_eq!(cross_site(&h), None);
    }

    #[test]
    fn limits_read_as_people_say_them() {
        assert_eq!(span(Duration::from_secs(3600)), "1 h");
        assert_eq!(span(Duration::from_secs(1800)), "30 min");
        assert_eq!(span(Duration::from_secs(2)), "2 s");
    }
}
